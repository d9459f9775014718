//! The simple commands of a `bash` call, as the policy engine matches them (issue 32): `ls &&
//! rm -rf /` is two commands, and a rule that allows `ls*` does not allow the second.
//!
//! The command line is parsed by [`rable`] (a GNU Bash 5.3-compatible parser; decision 0038 says
//! why this one). Every simple command anywhere in the tree counts: in lists (`;`, `&&`, `||`,
//! `&`), pipelines, subshells, brace groups, `if`/`while`/`for`/`case` bodies, functions,
//! command and process substitutions (`$(…)`, `` `…` ``, `<(…)`), and the literal script of
//! `bash -c '…'`, `sh -c`, `eval '…'` (parsed again, at most [`MAX_NESTED_SHELLS`] deep). Words
//! are unquoted with [`shlex`]; a word with expansions keeps its source text (`$HOME`).
//!
//! Each simple command has several **views** for matching: its text, its text with the program
//! named by its base name (`/bin/rm -rf /` → `rm -rf /`), and the same for the command a wrapper
//! runs (`sudo`, `env A=1`, `nohup`, `timeout 5`, `xargs`…). A deny or ask rule matches when any
//! view of any command matches; an allow rule only when the innermost command of **every**
//! simple command matches and nothing is [`Parsed::opaque`].
//!
//! **Opaque** is what a static reading cannot see through: a program name that is an expansion
//! (`$CMD`, `$(which rm)`), `bash -c "$SCRIPT"`, an unquoted here-document with substitutions,
//! a command line the parser refuses or that exceeds a bound. Such a call is never *allowed* by
//! a rule, only by the absence of one; deny and ask rules still see its source text as a view.
//!
//! This is a guardrail for what an agent runs, not a sandbox: a program may still run others
//! (`find -exec`, `make`, a script file). The sandbox (decision 0036's runner confinement) is
//! the boundary; policy decides what is asked first.

use rable::{ListItem, Node, NodeKind};

/// Longest command line parsed, in bytes; a longer one is opaque.
pub const MAX_PARSED_BYTES: usize = 64 * 1024;
/// Most simple commands collected from one call; a call with more is opaque.
pub const MAX_SIMPLE_COMMANDS: usize = 512;
/// Most opening brackets (`(`, `{`, backquotes) a parsed command line may hold. The parser
/// recurses once per level, and a Worker's stack is small: beyond this the line is opaque
/// without being parsed.
pub const MAX_OPENERS: usize = 128;
/// How deep `bash -c '…'` inside `bash -c '…'` is followed.
pub const MAX_NESTED_SHELLS: usize = 3;

/// Programs that run the command given after their own options.
const WRAPPERS: &[&str] = &[
    "sudo",
    "doas",
    "env",
    "nohup",
    "time",
    "command",
    "exec",
    "nice",
    "timeout",
    "xargs",
    "stdbuf",
    "ionice",
    "chrt",
    "setsid",
    "caffeinate",
];
/// Programs whose `-c` argument is a script.
const SHELLS: &[&str] = &["bash", "sh", "zsh", "dash", "ksh"];

/// One simple command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimpleCommand {
    /// Its words, unquoted, joined by single spaces (`git push origin main`).
    pub text: String,
    /// Everything deny and ask rules match against (its text first).
    pub views: Vec<String>,
    /// What allow rules match against: the innermost command, as written and by base name.
    pub allow_views: Vec<String>,
}

/// A command line read for matching.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Parsed {
    /// Its simple commands, in source order.
    pub commands: Vec<SimpleCommand>,
    /// Whether part of it could not be read statically (see the module docs); allow rules then
    /// never match it.
    pub opaque: bool,
    /// The files it redirects output to (`> out.txt`, `>> log`), for `path` rules.
    pub written_paths: Vec<String>,
    /// The whole command line: one more view for deny and ask rules.
    pub source: String,
}

/// Reads `source` (a `bash` tool's `command`).
pub fn parse(source: &str) -> Parsed {
    let mut parsed = Parsed {
        source: source.to_string(),
        ..Parsed::default()
    };
    collect(source, 0, &mut parsed);
    parsed
}

fn collect(source: &str, depth: usize, parsed: &mut Parsed) {
    let openers = source
        .chars()
        .filter(|c| matches!(c, '(' | '{' | '`'))
        .count();
    if source.len() > MAX_PARSED_BYTES || openers > MAX_OPENERS {
        parsed.opaque = true;
        return;
    }
    let nodes = match rable::parse(source, false) {
        Ok(nodes) => nodes,
        Err(_) => {
            parsed.opaque = true;
            return;
        }
    };
    let mut walker = Walker {
        parsed,
        depth,
        substitutions: 0,
    };
    for node in &nodes {
        walker.node(node);
    }
    // A substitution the walk did not reach (in an arithmetic expansion or a `[[ ]]` test,
    // say) runs a command nobody matched. Single-quoted text counted here only makes the line
    // opaque, which is the safe side.
    let substitutions = walker.substitutions;
    if substitution_markers(source) > substitutions {
        parsed.opaque = true;
    }
}

/// How many command or process substitutions `source`'s text seems to hold.
fn substitution_markers(source: &str) -> usize {
    let dollar_paren = source.matches("$(").count() - source.matches("$((").count();
    let process = source.matches("<(").count() + source.matches(">(").count();
    dollar_paren + process + source.matches('`').count() / 2
}

struct Walker<'p> {
    parsed: &'p mut Parsed,
    depth: usize,
    substitutions: usize,
}

impl Walker<'_> {
    fn node(&mut self, node: &Node) {
        if self.parsed.commands.len() > MAX_SIMPLE_COMMANDS {
            self.parsed.opaque = true;
            return;
        }
        match &node.kind {
            NodeKind::Command {
                assignments,
                words,
                redirects,
            } => {
                self.nodes(assignments);
                self.nodes(redirects);
                self.simple_command(words);
            }
            NodeKind::Word { parts, .. } => self.nodes(parts),
            NodeKind::CommandSubstitution { command, .. }
            | NodeKind::ProcessSubstitution { command, .. } => {
                self.substitutions += 1;
                self.node(command);
            }
            NodeKind::Pipeline { commands, .. } => self.nodes(commands),
            NodeKind::List { items } => {
                for ListItem { command, .. } in items {
                    self.node(command);
                }
            }
            NodeKind::If {
                condition,
                then_body,
                else_body,
                redirects,
            } => {
                self.node(condition);
                self.node(then_body);
                if let Some(e) = else_body {
                    self.node(e);
                }
                self.nodes(redirects);
            }
            NodeKind::While {
                condition,
                body,
                redirects,
            }
            | NodeKind::Until {
                condition,
                body,
                redirects,
            } => {
                self.node(condition);
                self.node(body);
                self.nodes(redirects);
            }
            NodeKind::For {
                words,
                body,
                redirects,
                ..
            }
            | NodeKind::Select {
                words,
                body,
                redirects,
                ..
            } => {
                if let Some(words) = words {
                    self.nodes(words);
                }
                self.node(body);
                self.nodes(redirects);
            }
            NodeKind::ForArith {
                body, redirects, ..
            } => {
                self.node(body);
                self.nodes(redirects);
            }
            NodeKind::Case {
                word,
                patterns,
                redirects,
            } => {
                self.node(word);
                for pattern in patterns {
                    self.nodes(&pattern.patterns);
                    if let Some(body) = &pattern.body {
                        self.node(body);
                    }
                }
                self.nodes(redirects);
            }
            NodeKind::Function { body, .. } => self.node(body),
            NodeKind::Subshell { body, redirects } | NodeKind::BraceGroup { body, redirects } => {
                self.node(body);
                self.nodes(redirects);
            }
            NodeKind::Coproc { command, .. } => self.node(command),
            NodeKind::Negation { pipeline } | NodeKind::Time { pipeline, .. } => {
                self.node(pipeline)
            }
            NodeKind::Redirect { op, target, .. } => {
                self.node(target);
                // `>&2`, `2>&1` duplicate a descriptor; `&>` and `>>` write a file.
                if op.contains('>')
                    && !op.ends_with('&')
                    && let Some(path) = literal(target)
                    && !path.starts_with('&')
                {
                    self.parsed.written_paths.push(path);
                }
            }
            // An unquoted here-document expands its substitutions when it runs.
            NodeKind::HereDoc {
                content, quoted, ..
            } if !quoted && (content.contains("$(") || content.contains('`')) => {
                self.parsed.opaque = true;
            }
            NodeKind::Array { elements } => self.nodes(elements),
            // Literals, parameter expansions, arithmetic and tests run no command themselves;
            // a substitution inside them is caught by `substitution_markers`.
            _ => {}
        }
    }

    fn nodes(&mut self, nodes: &[Node]) {
        for node in nodes {
            self.node(node);
        }
    }

    /// Records the simple command of `words` (nothing for a bare assignment).
    fn simple_command(&mut self, words: &[Node]) {
        self.nodes(words);
        if words.is_empty() {
            return;
        }
        let rendered: Vec<Word> = words.iter().map(word).collect();
        if !rendered[0].literal {
            // `$CMD args`, `$(which rm) -rf /`: the program is decided when it runs.
            self.parsed.opaque = true;
        }
        let text = join(&rendered);
        let mut views = vec![text.clone()];
        let push = |views: &mut Vec<String>, view: String| {
            if !views.contains(&view) {
                views.push(view);
            }
        };
        push(&mut views, by_base_name(&rendered));
        let inner = unwrap(&rendered);
        push(&mut views, join(inner));
        push(&mut views, by_base_name(inner));
        let allow_views = vec![join(inner), by_base_name(inner)];
        self.script_argument(inner);
        self.parsed.commands.push(SimpleCommand {
            text,
            views,
            allow_views,
        });
    }

    /// `bash -c 'script'`, `eval 'script'`: the script's own commands count too.
    fn script_argument(&mut self, words: &[Word]) {
        let Some(program) = words.first() else {
            return;
        };
        let name = base_name(&program.text);
        let script: Vec<&Word> = if name == "eval" {
            words[1..].iter().collect()
        } else if SHELLS.contains(&name) {
            match words.iter().position(|w| is_dash_c(&w.text)) {
                Some(i) => words.get(i + 1).into_iter().collect(),
                None => return,
            }
        } else {
            return;
        };
        if script.is_empty() {
            return;
        }
        if script.iter().any(|w| !w.literal) || self.depth >= MAX_NESTED_SHELLS {
            self.parsed.opaque = true;
            return;
        }
        let text = script
            .iter()
            .map(|w| w.text.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        collect(&text, self.depth + 1, self.parsed);
    }
}

/// `-c`, or a cluster of single-letter options that holds `c` (`-lc`, `-ec`).
fn is_dash_c(word: &str) -> bool {
    word.strip_prefix('-')
        .is_some_and(|flags| !flags.starts_with('-') && flags.contains('c'))
}

/// A word as matched: unquoted when it is literal, else its source text.
struct Word {
    text: String,
    literal: bool,
}

fn word(node: &Node) -> Word {
    match literal(node) {
        Some(text) => Word {
            text,
            literal: true,
        },
        None => Word {
            text: match &node.kind {
                NodeKind::Word { value, .. } => value.clone(),
                _ => String::new(),
            },
            literal: false,
        },
    }
}

/// The unquoted text of `node` when it has no expansion.
fn literal(node: &Node) -> Option<String> {
    let NodeKind::Word { value, parts, .. } = &node.kind else {
        return None;
    };
    let all_literal = parts
        .iter()
        .all(|p| matches!(p.kind, NodeKind::WordLiteral { .. }));
    if !all_literal || value.contains('$') || value.contains('`') {
        // `$` inside double quotes expands; inside single quotes it would not, but telling
        // the two apart here is the parser's job, and a non-literal word is the safe reading.
        return None;
    }
    match shlex::split(value) {
        Some(mut words) if words.len() == 1 => words.pop(),
        Some(words) if words.is_empty() => Some(String::new()),
        _ => None,
    }
}

fn join(words: &[Word]) -> String {
    words
        .iter()
        .map(|w| w.text.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The text with the program named by its base name.
fn by_base_name(words: &[Word]) -> String {
    let mut parts: Vec<&str> = words.iter().map(|w| w.text.as_str()).collect();
    if let Some(first) = parts.first_mut() {
        *first = base_name(first);
    }
    parts.join(" ")
}

fn base_name(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// The command a chain of wrappers runs (`sudo -u x env A=1 nohup rm -rf /` → `rm -rf /`); the
/// words themselves when the first is no wrapper or nothing follows it.
fn unwrap(words: &[Word]) -> &[Word] {
    let mut rest = words;
    while let Some(first) = rest.first() {
        let name = base_name(&first.text);
        if !first.literal || !WRAPPERS.contains(&name) {
            break;
        }
        let mut i = 1;
        while let Some(w) = rest.get(i) {
            let t = w.text.as_str();
            let takes_value = matches!(
                (name, t),
                ("sudo" | "doas", "-u" | "-g" | "-C" | "-D")
                    | ("env", "-u" | "-C" | "-S")
                    | ("nice", "-n")
                    | ("timeout", "-s" | "-k" | "--signal" | "--kill-after")
                    | ("xargs", "-I" | "-n" | "-P" | "-L" | "-d" | "-s" | "-E")
                    | ("ionice", "-c" | "-n" | "-p")
                    | ("stdbuf", "-i" | "-o" | "-e")
            );
            if t.starts_with('-') && t.len() > 1 {
                i += if takes_value { 2 } else { 1 };
            } else if name == "env" && t.contains('=') {
                i += 1;
            } else if name == "timeout" && t.chars().next().is_some_and(|c| c.is_ascii_digit()) {
                i += 1; // the duration
            } else if name == "chrt" && t.chars().all(|c| c.is_ascii_digit()) {
                i += 1; // the priority
            } else {
                break;
            }
        }
        if i >= rest.len() {
            break;
        }
        rest = &rest[i..];
    }
    rest
}
