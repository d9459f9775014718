//! The `set_model` tool and js `wuhu.session.setModel` (one rule for both, so neither tool
//! module depends on the other): who may switch, and what the switch records for the actor.

use wuhu_core::authority::{self, SessionAction, SessionFacts};

use crate::tool_context::ToolContext;

/// What `set_model` (and js `wuhu.session.setModel`) did.
pub(crate) struct ModelSet {
    /// The provider and model the next request goes to.
    pub(crate) provider: String,
    pub(crate) model: String,
    /// Whether that is a switch (else the session already used it).
    pub(crate) switched: bool,
    /// The tool result.
    pub(crate) text: String,
}

/// `set_model` and js `wuhu.session.setModel`: allowed when everyone the turn acts for may
/// prompt the session (who may `PATCH` its model); the actor switches when the call finishes
/// (`ToolContext::model_switch`).
pub(crate) fn set_model(
    context: &ToolContext,
    arguments: &serde_json::Value,
) -> Result<ModelSet, String> {
    let facts = SessionFacts {
        owner: &context.session.owner,
        created_by: &context.session.created_by,
        access: context.session.parent_session.access,
    };
    if !authority::turn_allows(
        &context.session.tenant,
        &context.acting_for,
        facts,
        SessionAction::Prompt,
    ) {
        return Err(
            "set_model: the model may be switched only in a turn whose people may all prompt this session"
                .into(),
        );
    }
    let (provider, model) = context.model_switch.borrow().clone().unwrap_or_else(|| {
        (
            context.session.parent_session.provider.clone(),
            context.session.parent_session.model.clone(),
        )
    });
    let current = wuhu_core::wire::Header {
        system_prompt: String::new(),
        provider,
        model,
        reasoning: None,
    };
    Ok(match wuhu_core::tools::model_switch(arguments, &current)? {
        None => ModelSet {
            text: format!(
                "This session already uses {} ({}).",
                current.model, current.provider
            ),
            provider: current.provider,
            model: current.model,
            switched: false,
        },
        Some(to) => {
            // The same rule as a `PATCH`: a provider this server allows, a price while a USD
            // budget applies.
            context
                .models
                .check(&to.provider, &to.model)
                .map_err(|e| format!("set_model: {e}"))?;
            *context.model_switch.borrow_mut() = Some((to.provider.clone(), to.model.clone()));
            ModelSet {
                text: format!(
                    "Switched from {} ({}) to {} ({}): the next request goes to it.",
                    current.model, current.provider, to.model, to.provider
                ),
                provider: to.provider,
                model: to.model,
                switched: true,
            }
        }
    })
}
