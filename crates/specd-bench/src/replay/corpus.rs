//! Text the built-in workloads are made from: a frozen copy of some of specd's own source
//! files (`corpus/`, so that the workloads stay the same while the code changes), embedded
//! at build time, and the prose of their doc comments. Shipping nothing else keeps the workloads
//! reproducible from a checkout and free of third-party text.

/// Source files embedded in the binary (path as shown in prompts, content).
pub const FILES: &[(&str, &str)] = &[
    (
        "src/spec/session.rs",
        include_str!("../../corpus/src_spec_session.rs.txt"),
    ),
    (
        "src/spec/request.rs",
        include_str!("../../corpus/src_spec_request.rs.txt"),
    ),
    (
        "src/spec/generation.rs",
        include_str!("../../corpus/src_spec_generation.rs.txt"),
    ),
    (
        "src/spec/output.rs",
        include_str!("../../corpus/src_spec_output.rs.txt"),
    ),
    (
        "src/upstream/vllm.rs",
        include_str!("../../corpus/src_upstream_vllm.rs.txt"),
    ),
    (
        "src/upstream/mod.rs",
        include_str!("../../corpus/src_upstream_mod.rs.txt"),
    ),
    (
        "src/server/respond.rs",
        include_str!("../../corpus/src_server_respond.rs.txt"),
    ),
    (
        "src/server/generate.rs",
        include_str!("../../corpus/src_server_generate.rs.txt"),
    ),
    (
        "src/tokens.rs",
        include_str!("../../corpus/src_tokens.rs.txt"),
    ),
    (
        "src/config.rs",
        include_str!("../../corpus/src_config.rs.txt"),
    ),
    (
        "src/draft/ngram.rs",
        include_str!("../../corpus/src_draft_ngram.rs.txt"),
    ),
    (
        "scripts/make_models.py",
        include_str!("../../corpus/scripts_make_models.py.txt"),
    ),
    (
        "scripts/render_dashboard.py",
        include_str!("../../corpus/scripts_render_dashboard.py.txt"),
    ),
];

/// A titled run of prose.
#[derive(Debug, Clone)]
pub struct Section {
    pub title: String,
    pub paragraphs: Vec<String>,
}

impl Section {
    pub fn text(&self) -> String {
        format!("## {}\n\n{}\n", self.title, self.paragraphs.join("\n\n"))
    }
}

/// Comment text of one line: Rust doc comments (`//!`, `///`) and Python `#` comments.
fn comment_text(line: &str, python: bool) -> Option<&str> {
    let t = line.trim_start();
    let rest = if python {
        t.strip_prefix('#').filter(|r| !r.starts_with('!'))?
    } else {
        t.strip_prefix("//!").or_else(|| t.strip_prefix("///"))?
    };
    Some(rest.trim())
}

/// Prose sections: per file, consecutive comment lines joined into paragraphs. Only
/// paragraphs that read like sentences (several words) are kept.
pub fn sections() -> Vec<Section> {
    let mut out = Vec::new();
    for (path, src) in FILES {
        let python = path.ends_with(".py");
        let mut paragraphs = Vec::new();
        let mut cur: Vec<&str> = Vec::new();
        let flush = |cur: &mut Vec<&str>, paragraphs: &mut Vec<String>| {
            let p = cur.join(" ");
            if p.split_whitespace().count() >= 6 {
                paragraphs.push(p);
            }
            cur.clear();
        };
        for line in src.lines() {
            match comment_text(line, python) {
                Some("") | None => flush(&mut cur, &mut paragraphs),
                Some(t) => cur.push(t),
            }
        }
        flush(&mut cur, &mut paragraphs);
        if !paragraphs.is_empty() {
            out.push(Section {
                title: (*path).to_string(),
                paragraphs,
            });
        }
    }
    out
}

/// Sentences of a paragraph (split after '.', '?' or '!' followed by a space).
pub fn sentences(p: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        cur.push(c);
        if matches!(c, '.' | '?' | '!') && chars.peek().is_none_or(|n| *n == ' ') {
            let s = cur.trim().to_string();
            if !s.is_empty() {
                out.push(s);
            }
            cur.clear();
        }
    }
    let s = cur.trim().to_string();
    if !s.is_empty() {
        out.push(s);
    }
    out
}

/// Contiguous whole lines of `text` around line `start`, up to about `chars` characters:
/// from `start` on, then earlier lines when the file ends first.
pub fn window(text: &str, start: usize, chars: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let start = start.min(lines.len() - 1);
    let (mut lo, mut hi) = (start, start);
    let mut size = 0;
    // Forward first, then backward, one line at a time.
    while hi < lines.len() && (size == 0 || size + lines[hi].len() < chars) {
        size += lines[hi].len() + 1;
        hi += 1;
    }
    while hi == lines.len() && lo > 0 && size + lines[lo - 1].len() < chars {
        lo -= 1;
        size += lines[lo].len() + 1;
    }
    let mut out = lines[lo..hi].join("\n");
    out.push('\n');
    out
}

/// Prose sections concatenated, starting at section `start`, up to about `chars` characters
/// (cut at a paragraph boundary, but at least one paragraph). One pass over the corpus at
/// most, so a very large request gets the whole corpus.
pub fn document(start: usize, chars: usize) -> String {
    let secs = sections();
    let mut out = String::new();
    for i in 0..secs.len() {
        let s = &secs[(start + i) % secs.len()];
        let head = format!("## {}\n\n", s.title);
        for (j, p) in s.paragraphs.iter().enumerate() {
            let add = if j == 0 { head.len() } else { 0 } + p.len() + 2;
            if !out.is_empty() && out.len() + add > chars {
                return out;
            }
            if j == 0 {
                out.push_str(&head);
            }
            out.push_str(p);
            out.push_str("\n\n");
        }
    }
    out
}

/// Identifiers (ASCII words with an underscore or of 5+ letters) that occur at least twice in
/// `text`, in order of first occurrence.
pub fn repeated_identifiers(text: &str) -> Vec<String> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for w in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        let ident = w.len() >= 5
            && w.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && !KEYWORDS.contains(&w);
        if !ident {
            continue;
        }
        match counts.iter_mut().find(|(k, _)| k == w) {
            Some((_, n)) => *n += 1,
            None => counts.push((w.to_string(), 1)),
        }
    }
    counts
        .into_iter()
        .filter(|(_, n)| *n >= 2)
        .map(|(k, _)| k)
        .collect()
}

const KEYWORDS: &[&str] = &[
    "async", "await", "break", "const", "continue", "crate", "false", "match", "return", "self",
    "super", "trait", "where", "while", "import", "lambda", "raise", "yield", "class", "print",
    "String", "Option", "Result", "usize",
];

/// Function names defined in a source file (`fn name` / `def name`).
pub fn function_names(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in src.lines() {
        let t = line.trim_start();
        let t = t.strip_prefix("pub ").unwrap_or(t);
        let t = t.strip_prefix("async ").unwrap_or(t);
        let rest = t.strip_prefix("fn ").or_else(|| t.strip_prefix("def "));
        if let Some(r) = rest {
            let name: String = r
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_has_prose_and_code() {
        let secs = sections();
        assert!(secs.len() >= 8, "{} sections", secs.len());
        let prose: usize = secs.iter().map(|s| s.text().len()).sum();
        assert!(prose > 8_000, "only {prose} characters of prose");
        assert!(FILES.iter().all(|(_, s)| s.len() > 1_000));
    }

    #[test]
    fn windows_and_documents_respect_sizes() {
        let (_, src) = FILES[0];
        let w = window(src, 10, 500);
        assert!(w.len() <= 500 && w.len() > 300, "{}", w.len());
        assert!(src.contains(&w), "a window is contiguous");
        let n = src.lines().count();
        let tail = window(src, n - 2, 800);
        assert!(
            tail.len() > 600 && src.ends_with(tail.trim_start_matches('\n')),
            "{}",
            tail.len()
        );
        let d = document(3, 4_000);
        assert!(d.len() <= 4_000 && d.len() > 2_000, "{}", d.len());
        assert!(d.starts_with("## "));
    }

    #[test]
    fn sentence_split_and_identifiers() {
        let s = sentences("One two. Three? Four e.g.x five");
        assert_eq!(s, vec!["One two.", "Three?", "Four e.g.x five"]);
        let ids = repeated_identifiers("let speed = tokens; speed += 1; other_name; other_name");
        assert_eq!(ids, vec!["speed", "other_name"]);
        assert_eq!(
            function_names("pub async fn run(x) {}\n    def fit(self):\nfn run()"),
            vec!["run", "fit"]
        );
    }
}
