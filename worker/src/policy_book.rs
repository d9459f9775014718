//! The policy documents one reading of the tenant's settings holds (decision 0038), for
//! `crate::policy_gate`.
//!
//! The tenant's `config/policy.json` is read with the tenant's settings (a change is told to
//! the sessions that keep a reading, decision 0021); a user's `users/<sub>/policy.json` is read
//! the first time a call of this reading reaches one of their runners, and kept with it (a
//! change is told the same way, `workspace_io::settings_stored`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use wuhu_core::policy::{self, Policy};

/// The policies one reading of the settings holds.
#[derive(Default)]
pub(crate) struct PolicyBook {
    tenant: Policy,
    /// Each user's, read when first needed: an unreadable or invalid one is kept as its error.
    users: RefCell<HashMap<String, Result<Rc<Policy>, String>>>,
}

impl PolicyBook {
    pub(crate) fn new(tenant: Policy) -> PolicyBook {
        PolicyBook {
            tenant,
            users: RefCell::default(),
        }
    }

    /// `config/policy.json`.
    pub(crate) fn tenant(&self) -> &Policy {
        &self.tenant
    }

    /// `sub`'s own policy. A failed read is not kept (the next call reads again); an invalid
    /// document is, until it changes.
    pub(crate) async fn user(
        &self,
        env: &worker::Env,
        tenant: &str,
        sub: &str,
    ) -> Result<Rc<Policy>, String> {
        if let Some(kept) = self.users.borrow().get(sub) {
            return kept.clone();
        }
        let path = policy::user_policy_path(sub);
        let doc = crate::workspace_io::read(env, tenant, &path)
            .await
            .map_err(|e| format!("{path} could not be read: {}", e.message))?;
        let parsed = Policy::parse(&path, doc.as_ref().map(|d| d.content.as_str()))
            .map(Rc::new)
            .map_err(|e| e.to_string());
        self.users
            .borrow_mut()
            .insert(sub.to_string(), parsed.clone());
        parsed
    }
}
