//! Just enough of Python to read a tokenizer class's literal settings: `NAME = <string>`
//! where the string is one literal, adjacent literals, or `"sep".join([literals])` (the
//! shape Kimi's `pat_str` has), and `NAME = <integer>`. Anything else reads as absent.

/// The string assigned to `name` (first assignment in the source).
pub fn string_assignment(code: &str, name: &str) -> Option<String> {
    let mut p = Parser::new(after_assignment(code, name)?);
    let first = p.concat()?;
    p.skip_blank();
    if !p.eat(".join") {
        return Some(first);
    }
    p.skip_blank();
    if !p.eat("(") {
        return None;
    }
    p.skip_blank();
    let close = if p.eat("[") {
        ']'
    } else if p.eat("(") {
        ')'
    } else {
        return None;
    };
    let mut parts = Vec::new();
    loop {
        p.skip_blank();
        if p.eat_char(close) {
            break;
        }
        parts.push(p.concat()?);
        p.skip_blank();
        if !p.eat(",") {
            p.skip_blank();
            if !p.eat_char(close) {
                return None;
            }
            break;
        }
    }
    Some(parts.join(&first))
}

/// The non-negative integer assigned to `name`.
pub fn int_assignment(code: &str, name: &str) -> Option<u32> {
    let rest = after_assignment(code, name)?;
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '_')
        .filter(|c| *c != '_')
        .collect();
    digits.parse().ok()
}

/// The source after `name =` (or `name: T =`) at the start of a line.
fn after_assignment<'a>(code: &'a str, name: &str) -> Option<&'a str> {
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let start = offset + (line.len() - line.trim_start().len());
        offset += line.len();
        let Some(rest) = line.trim_start().strip_prefix(name) else {
            continue;
        };
        // `name =`, `name: str =`, not `name_other =` nor `name == x`.
        let head = rest.split('=').next().unwrap_or("");
        let typed = head.trim_start().starts_with(':') || head.trim().is_empty();
        if rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') || !typed {
            continue;
        }
        // An annotation alone (`name: str`) assigns nothing; a later line may.
        let Some(eq) = rest.find('=') else {
            continue;
        };
        if rest[eq + 1..].starts_with('=') {
            continue;
        }
        let at = start + name.len() + eq + 1;
        return code.get(at..);
    }
    None
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Parser<'a> {
    fn new(s: &'a str) -> Self {
        Parser { s, i: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }

    fn eat(&mut self, t: &str) -> bool {
        if self.rest().starts_with(t) {
            self.i += t.len();
            true
        } else {
            false
        }
    }

    fn eat_char(&mut self, c: char) -> bool {
        let mut b = [0u8; 4];
        self.eat(c.encode_utf8(&mut b))
    }

    /// Whitespace, line continuations and comments.
    fn skip_blank(&mut self) {
        loop {
            let r = self.rest();
            let t = r.trim_start();
            self.i += r.len() - t.len();
            if self.eat("\\\n") {
                continue;
            }
            if t.starts_with('#') {
                self.i += t.find('\n').unwrap_or(t.len());
                continue;
            }
            break;
        }
    }

    /// One literal or several adjacent ones (optionally in parentheses), joined.
    fn concat(&mut self) -> Option<String> {
        self.skip_blank();
        if self.eat("(") {
            let s = self.concat()?;
            self.skip_blank();
            return self.eat(")").then_some(s);
        }
        let mut out = self.literal()?;
        loop {
            let save = self.i;
            self.skip_blank();
            match self.literal() {
                Some(s) => out.push_str(&s),
                None => {
                    self.i = save;
                    return Some(out);
                }
            }
        }
    }

    fn literal(&mut self) -> Option<String> {
        let r = self.rest();
        let prefix = r
            .chars()
            .take_while(|c| matches!(c, 'r' | 'R' | 'u' | 'U'))
            .count();
        let raw = r[..prefix].contains(['r', 'R']);
        let body = &r[prefix..];
        let quote = ["\"\"\"", "'''", "\"", "'"]
            .into_iter()
            .find(|q| body.starts_with(q))?;
        let mut out = String::new();
        let mut chars = body[quote.len()..].char_indices();
        while let Some((j, c)) = chars.next() {
            if body[quote.len() + j..].starts_with(quote) {
                self.i += prefix + quote.len() + j + quote.len();
                return Some(out);
            }
            if c == '\n' && quote.len() == 1 {
                return None;
            }
            if c != '\\' {
                out.push(c);
                continue;
            }
            let (_, n) = chars.next()?;
            if raw {
                out.push('\\');
                out.push(n);
                continue;
            }
            match n {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '\\' | '\'' | '"' => out.push(n),
                '\n' => {}
                // Python keeps unknown escapes such as `\p` as they are.
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
        }
        None
    }
}
