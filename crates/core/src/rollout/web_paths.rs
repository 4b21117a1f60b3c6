//! The paths of web checks and hooks, decided without a request: the URL
//! path Git names (it must stay under the operator's URL), and the JSON path
//! that reads a number from an answer. Pure: validation and the planner
//! read them; `web` sends the requests.

use serde_json::Value;

/// What a path from Git may hold: it is appended to the operator's URL, so
/// it stays under it (no `..`, no scheme or host, no `//`, no fragment).
pub fn path_problem(path: &str) -> Option<String> {
    // No `%`: an escaped dot or slash decodes, on the far side, into a way out.
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~/?&=+,{}".contains(c);
    if !path.starts_with('/') {
        return Some(format!(
            "path {:?} must start with \"/\"",
            super::api::bounded_line(path, 80)
        ));
    }
    if path.contains("..") || path.contains("//") || !path.chars().all(allowed) {
        return Some(format!(
            "path {:?} may hold letters, digits, - . _ ~ / ? & = + , and {{{{variables}}}}, without \"..\" or \"//\"",
            super::api::bounded_line(path, 80)
        ));
    }
    None
}

/// One step of a JSON path: a field, or an index into a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Field(String),
    Index(usize),
}

/// `$.data.checks[0].ok`: fields by name after a dot, list indexes in brackets.
pub fn parse_json_path(path: &str) -> Result<Vec<Segment>, String> {
    let shown = || super::api::bounded_line(path, 80);
    let rest = path
        .strip_prefix('$')
        .ok_or_else(|| format!("jsonPath {:?} must start with \"$\"", shown()))?;
    let mut segments = Vec::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                let mut field = String::new();
                while let Some(&next) = chars.peek() {
                    if next == '.' || next == '[' {
                        break;
                    }
                    field.push(next);
                    chars.next();
                }
                if field.is_empty() || !field.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-') {
                    return Err(format!(
                        "jsonPath {:?}: a field is a name of letters, digits, _ and -",
                        shown()
                    ));
                }
                segments.push(Segment::Field(field));
            }
            '[' => {
                let digits: String = chars.by_ref().take_while(|c| *c != ']').collect();
                if !rest.contains(&format!("[{digits}]")) {
                    return Err(format!("jsonPath {:?}: a [ without its ]", shown()));
                }
                let index = digits
                    .parse()
                    .map_err(|_| format!("jsonPath {:?}: [{digits}] is not a list index", shown()))?;
                segments.push(Segment::Index(index));
            }
            other => return Err(format!("jsonPath {:?}: unexpected {other:?}", shown())),
        }
    }
    Ok(segments)
}

/// The number at `path` of an answer: a number, a boolean (true 1, false 0)
/// or a numeric string; `None` (no data) when nothing is there or it is null.
pub fn value_at(answer: &Value, path: &[Segment]) -> Result<Option<f64>, String> {
    let mut here = answer;
    for segment in path {
        here = match segment {
            Segment::Field(name) => &here[name.as_str()],
            Segment::Index(i) => &here[*i],
        };
    }
    match here {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(if *b { 1.0 } else { 0.0 })),
        Value::Number(n) => Ok(n.as_f64()),
        // The answer's text is not copied: a check's host may hold what Git should not read.
        Value::String(s) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| "the answer holds a string there that is not a number".to_string()),
        _ => Err("the answer holds a list or an object there, not a number".to_string()),
    }
}
