//! The `partial_json_parser` library (0.2.1.1.post7, in both servers' venvs) and the two
//! wrappers the servers call it through. The library completes a prefix of a JSON
//! document (`fix_fast`, falling back on `_fix`) and reads it with `json.loads`. Every
//! quirk is kept — Python's character indexing (negative indices included), `str.strip`,
//! the index of a stripped string applied to the unstripped one — since a streamed
//! answer must split exactly as the server splits it. The wrappers differ in which
//! exceptions they recover from, so the library's exceptions keep their kinds
//! ([`Raised`]). Only `STR` partialness varies in the servers' calls: every other kind
//! is always allowed.

use super::pyjson::{self, PyValue};

/// An exception out of the library or `json`, by the kinds the wrappers tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raised {
    /// `IndexError("pop from empty list")`: `fix_fast` met a closer with nothing open.
    EmptyPop,
    /// `AssertionError`: one of `fix_fast`'s own assertions.
    Assertion,
    /// `MalformedJSON`: `_fix` could not complete the text.
    Malformed,
    /// `PartialJSON`: `_fix` met a partial value of a kind not allowed.
    Partial,
    /// `json.JSONDecodeError("Extra data")`: a whole value, then more than whitespace.
    ExtraData,
    /// Any other `json.JSONDecodeError`.
    Decode,
}

/// A Python exception inside the completion functions: `IndexError` is caught by the
/// enclosing array or object (it ends the document there); any other ends the whole
/// completion (`_fix` raises `MalformedJSON` for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum E {
    Index,
    Other,
}

/// What the library appends to complete a value: `True` (nothing, it was complete) or
/// a text (possibly empty, still partial).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tail {
    Done,
    Text(String),
}

/// A completion result: `None` is the library's `False` (partial, not allowed).
type Completed = Option<(isize, Tail)>;

/// A value and how many characters of the text it took.
pub type Loaded = (PyValue, usize);

/// vLLM's `partial_json_loads(text, flags)` (`vllm/tool_parsers/utils.py`): "Extra data"
/// reads the first value alone (`raw_decode` at the very start); every other exception
/// is raised. `strings`: `Allow.STR` is in the flags.
pub fn vllm_loads(text: &str, strings: bool) -> Result<Loaded, Raised> {
    match library_loads(text, strings) {
        Err(Raised::ExtraData) => raw_decode(text, 0),
        r => r,
    }
}

/// SGLang's `_partial_json_loads(text, flags)` (`srt/function_call/utils.py`): "Extra
/// data" and "pop from empty list" read the first value alone (`raw_decode` after the
/// leading JSON whitespace); an `AssertionError` is raised as a `JSONDecodeError`.
pub fn sglang_loads(text: &str, strings: bool) -> Result<Loaded, Raised> {
    match library_loads(text, strings) {
        Err(Raised::ExtraData | Raised::EmptyPop) => {
            let blank = text.chars().take_while(|c| " \t\n\r".contains(*c)).count();
            raw_decode(text, blank)
        }
        Err(Raised::Assertion) => Err(Raised::Decode),
        r => r,
    }
}

/// `partial_json_parser.loads(text, flags)`: `json.loads(head + tail)` of `fix_fast`.
fn library_loads(text: &str, strings: bool) -> Result<Loaded, Raised> {
    let s: Vec<char> = text.chars().collect();
    let (head, tail) = fix_fast(&s, strings)?;
    match pyjson::loads_or_extra(&(head + &tail)) {
        Ok(v) => Ok((v, s.len())),
        Err(true) => Err(Raised::ExtraData),
        Err(false) => Err(Raised::Decode),
    }
}

/// `JSONDecoder().raw_decode(text, start)`, `start` in characters: the value and the
/// character where it ends.
fn raw_decode(text: &str, start: usize) -> Result<Loaded, Raised> {
    let from = text
        .char_indices()
        .nth(start)
        .map_or(text.len(), |(b, _)| b);
    let rest = &text[from..];
    let (v, bytes) = pyjson::raw_decode(rest).ok_or(Raised::Decode)?;
    Ok((v, start + rest[..bytes].chars().count()))
}

/// Python's `str.isspace` (and so `str.strip`).
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `s[k]`, a negative `k` counting from the end.
fn at(s: &[char], k: isize) -> Result<char, E> {
    let n = s.len() as isize;
    let k = if k < 0 { k + n } else { k };
    if (0..n).contains(&k) {
        Ok(s[k as usize])
    } else {
        Err(E::Index)
    }
}

/// A slice bound as Python clamps it.
fn bound(s: &[char], k: isize) -> usize {
    let n = s.len() as isize;
    let k = if k < 0 { (k + n).max(0) } else { k.min(n) };
    k as usize
}

/// `s[from:]`.
fn from(s: &[char], k: isize) -> &[char] {
    &s[bound(s, k)..]
}

/// `s[:to]`.
fn upto(s: &[char], k: isize) -> &[char] {
    &s[..bound(s, k)]
}

fn text(s: &[char]) -> String {
    s.iter().collect()
}

/// `s.rfind(pat, start, end)` with Python's bounds.
fn rfind(s: &[char], pat: &str, start: isize, end: isize) -> isize {
    let pat: Vec<char> = pat.chars().collect();
    let (a, b) = (bound(s, start), bound(s, end));
    if b < a + pat.len() {
        return -1;
    }
    (a..=b - pat.len())
        .rev()
        .find(|&k| s[k..k + pat.len()] == pat[..])
        .map_or(-1, |k| k as isize)
}

/// Whether an odd number of backslashes stands right before `index`.
fn escaped(s: &[char], index: isize) -> bool {
    let before = upto(s, index);
    let n = before.iter().rev().take_while(|&&c| c == '\\').count() as isize;
    // Python: `index - len(text_before.rstrip("\\"))`, modulo 2 (never negative).
    let count = index - (before.len() as isize - n);
    count.rem_euclid(2) == 1
}

fn skip_blank(s: &[char], mut k: isize) -> isize {
    while at(s, k).is_ok_and(py_space) {
        k += 1;
    }
    k
}

fn closing(stack: &[(isize, char)]) -> String {
    stack
        .iter()
        .rev()
        .map(|&(_, c)| if c == '{' { '}' } else { ']' })
        .collect()
}

fn complete_any(s: &[char], strings: bool, top: bool) -> Result<Completed, E> {
    let c = at(s, skip_blank(s, 0))?;
    match c {
        '"' => return complete_str(s, strings),
        '0'..='9' => return complete_num(s, top),
        '[' => return complete_arr(s, strings),
        '{' => return complete_obj(s, strings),
        _ => {}
    }
    let t = text(s);
    let word = |w: &str| -> Option<Completed> {
        if t.starts_with(w) {
            return Some(Some((w.chars().count() as isize, Tail::Done)));
        }
        w.starts_with(t.as_str())
            .then(|| Some((0, Tail::Text(w.to_string()))))
    };
    for w in ["null", "true", "false", "Infinity"] {
        if let Some(r) = word(w) {
            return Ok(r);
        }
    }
    if c == '-' {
        if s.len() == 1 {
            return Ok(None);
        } else if s[1] != 'I' {
            return complete_num(s, top);
        }
    }
    for w in ["-Infinity", "NaN"] {
        if let Some(r) = word(w) {
            return Ok(r);
        }
    }
    Err(E::Other)
}

fn complete_str(s: &[char], strings: bool) -> Result<Completed, E> {
    if at(s, 0)? != '"' {
        return Err(E::Other);
    }
    let len = s.len();
    let mut i = 1;
    while let Some(&c) = s.get(i) {
        match c {
            '\\' if i + 1 == len => break,
            '\\' => i += 2,
            '"' => return Ok(Some((i as isize + 1, Tail::Done))),
            _ => i += 1,
        }
    }
    if !strings {
        return Ok(None);
    }
    let i = i as isize;
    // An escape cut short is dropped whole.
    for (esc, back) in [("\\u", 5), ("\\U", 9), ("\\x", 3)] {
        let k = rfind(s, esc, (i - back).max(0), i);
        if k != -1 && !escaped(s, k) {
            return Ok(Some((k, Tail::Text("\"".into()))));
        }
    }
    Ok(Some((i, Tail::Text("\"".into()))))
}

fn complete_num(s: &[char], top: bool) -> Result<Completed, E> {
    let len = s.len() as isize;
    let mut i: isize = 1;
    while i < len && "1234567890.-+eE".contains(s[i as usize]) {
        i += 1;
    }
    let mut modified = false;
    while ".-+eE".contains(at(s, i - 1)?) {
        modified = true;
        i -= 1;
    }
    Ok(Some(if modified || (i == len && !top) {
        (i, Tail::Text(String::new()))
    } else {
        (i, Tail::Done)
    }))
}

/// The body of `complete_arr` and `complete_obj`: an `IndexError` ends the container
/// at its last complete item.
fn container(
    s: &[char],
    open: char,
    close: char,
    body: impl Fn(&mut isize, &mut isize) -> Result<Option<Completed>, E>,
) -> Result<Completed, E> {
    if at(s, 0)? != open {
        return Err(E::Other);
    }
    let (mut i, mut j) = (1, 1);
    loop {
        match body(&mut i, &mut j) {
            Ok(Some(r)) => return Ok(r),
            Ok(None) => {}
            Err(E::Index) => return Ok(Some((i, Tail::Text(close.to_string())))),
            Err(e) => return Err(e),
        }
    }
}

/// A nested value's result inside a container: complete (`None`, `j` moved past it)
/// or the container's own result.
fn nested(r: Completed, i: &mut isize, j: &mut isize, close: char) -> Option<Completed> {
    match r {
        None => Some(Some((*i, Tail::Text(close.to_string())))),
        Some((n, Tail::Done)) => {
            *j += n;
            *i = *j;
            None
        }
        Some((n, Tail::Text(t))) => Some(Some((*j + n, Tail::Text(t + &close.to_string())))),
    }
}

fn complete_arr(s: &[char], strings: bool) -> Result<Completed, E> {
    container(s, '[', ']', |i, j| {
        *j = skip_blank(s, *j);
        if at(s, *j)? == ']' {
            return Ok(Some(Some((*j + 1, Tail::Done))));
        }
        let r = complete_any(from(s, *j), strings, false)?;
        if let Some(done) = nested(r, i, j, ']') {
            return Ok(Some(done));
        }
        *j = skip_blank(s, *j);
        match at(s, *j)? {
            ',' => *j += 1,
            ']' => return Ok(Some(Some((*j + 1, Tail::Done)))),
            _ => return Err(E::Other),
        }
        Ok(None)
    })
}

fn complete_obj(s: &[char], strings: bool) -> Result<Completed, E> {
    container(s, '{', '}', |i, j| {
        *j = skip_blank(s, *j);
        if at(s, *j)? == '}' {
            return Ok(Some(Some((*j + 1, Tail::Done))));
        }
        match complete_str(from(s, *j), strings)? {
            Some((n, Tail::Done)) => *j += n,
            _ => return Ok(Some(Some((*i, Tail::Text("}".into()))))),
        }
        *j = skip_blank(s, *j);
        if at(s, *j)? != ':' {
            return Err(E::Other);
        }
        *j = skip_blank(s, *j + 1);
        let r = complete_any(from(s, *j), strings, false)?;
        if let Some(done) = nested(r, i, j, '}') {
            return Ok(Some(done));
        }
        *j = skip_blank(s, *j);
        match at(s, *j)? {
            ',' => *j += 1,
            '}' => return Ok(Some(Some((*j + 1, Tail::Done)))),
            _ => return Err(E::Other),
        }
        Ok(None)
    })
}

/// `_fix`: the slice of `s` the completion keeps (the stripped text's index applied to
/// `s` itself) and the completion.
fn fix(s: &[char], strings: bool, top: bool) -> Result<(Vec<char>, String), Raised> {
    let a = s.iter().take_while(|&&c| py_space(c)).count();
    let b = s.len() - s[a..].iter().rev().take_while(|&&c| py_space(c)).count();
    let stripped = &s[a..b];
    match complete_any(stripped, strings, top).map_err(|_| Raised::Malformed)? {
        None => Err(Raised::Partial),
        Some((index, tail)) => {
            let tail = match tail {
                Tail::Done => String::new(),
                Tail::Text(t) => t,
            };
            Ok((upto(s, index).to_vec(), tail))
        }
    }
}

/// `fix_fast`'s result: the kept text and its completion.
type Fixed = (String, String);

/// What `fix_fast` learns in its one scan over the quotes and brackets.
struct Scan<'a> {
    s: &'a [char],
    strings: bool,
    /// The open brackets (position, character), outermost first; never empty.
    stack: Vec<(isize, char)>,
    in_string: bool,
    /// Where the last string started and ended (-1: none).
    lss: isize,
    lse: isize,
    /// The last quote or bracket.
    last: (isize, char),
}

fn fix_fast(s: &[char], strings: bool) -> Result<Fixed, Raised> {
    let tokens: Vec<(isize, char)> = s
        .iter()
        .enumerate()
        .filter(|(_, c)| matches!(c, '"' | '[' | ']' | '{' | '}'))
        .map(|(k, &c)| (k as isize, c))
        .collect();
    let Some(&last) = tokens.last().filter(|_| tokens[0].1 != '"') else {
        let (h, t) = fix(s, strings, true)?;
        return Ok((text(&h), t));
    };
    let mut stack: Vec<(isize, char)> = Vec::new();
    let (mut in_string, mut lss, mut lse) = (false, -1isize, -1isize);
    for &(k, c) in &tokens {
        if c == '"' {
            if !in_string {
                in_string = true;
                lss = k;
            } else if !escaped(s, k) {
                in_string = false;
                lse = k;
            }
        } else if !in_string {
            match c {
                '}' | ']' => {
                    let (_, open) = stack.pop().ok_or(Raised::EmptyPop)?;
                    if (c == '}') != (open == '{') {
                        return Err(Raised::Assertion);
                    }
                }
                _ => stack.push((k, c)),
            }
        }
    }
    if stack.is_empty() {
        return Ok((text(s), String::new()));
    }
    let scan = Scan {
        s,
        strings,
        stack,
        in_string,
        lss,
        lse,
        last,
    };
    if scan.in_string {
        scan.in_string()
    } else {
        scan.after_value()
    }
}

impl Scan<'_> {
    fn top(&self) -> (isize, char) {
        self.stack[self.stack.len() - 1]
    }

    /// The stack without its innermost bracket.
    fn outer(&self) -> &[(isize, char)] {
        &self.stack[..self.stack.len() - 1]
    }

    fn keep(&self, k: isize, stack: &[(isize, char)]) -> Result<Fixed, Raised> {
        Ok((text(upto(self.s, k)), closing(stack)))
    }

    /// `s[:k]` and `_fix(s[k:])`, closed by `stack`.
    fn fixed_from(&self, k: isize, stack: &[(isize, char)]) -> Result<Fixed, Raised> {
        let (h, t) = fix(from(self.s, k), self.strings, false)?;
        Ok((text(upto(self.s, k)) + &text(&h), t + &closing(stack)))
    }

    /// The text ends inside a string.
    fn in_string(&self) -> Result<Fixed, Raised> {
        let (s, (top_at, top_c)) = (self.s, self.top());
        let (lss, lse) = (self.lss, self.lse);
        if !self.strings {
            // Not even a partial key or value: cut before it.
            if top_at > lse && top_c == '{' {
                return self.keep(top_at + 1, &self.stack);
            }
            let comma = rfind(s, ",", top_at.max(lse) + 1, lss);
            if comma != -1 {
                return self.keep(comma, &self.stack);
            }
            return before_last_key(s, top_at, lse, &self.stack);
        }
        if top_c == '[' {
            return self.fixed_from(lss, &self.stack);
        }
        let start = lse.max(top_at);
        let between = &s[bound(s, start + 1)..bound(s, lss).max(bound(s, start + 1))];
        if between.contains(&',') {
            let comma = rfind(s, ",", start, lss);
            let mut probe = vec![top_c];
            probe.extend_from_slice(from(s, comma + 1));
            let (h, t) = fix(&probe, self.strings, false)?;
            let head = text(upto(s, comma)) + &text(from(&h, 1));
            return Ok((head, t + &closing(self.outer())));
        }
        if between.contains(&':') {
            return self.fixed_from(lss, &self.stack);
        }
        self.keep(lss, &self.stack)
    }

    /// The text ends outside strings.
    fn after_value(&self) -> Result<Fixed, Raised> {
        let (s, (top_at, top_c)) = (self.s, self.top());
        let (last_i, last_c) = self.last;
        let comma = rfind(s, ",", self.lse.max(last_i) + 1, s.len() as isize);
        if comma != -1 {
            if text(from(s, comma + 1)).trim_matches(py_space).is_empty() {
                return self.keep(comma, &self.stack);
            }
            if top_c != '[' {
                return Err(Raised::Assertion);
            }
            let mut probe = vec![top_c];
            probe.extend_from_slice(from(s, comma + 1));
            return rejoin(s, comma, &probe, self.strings, self.outer());
        }
        match last_c {
            ']' | '}' => {
                if !text(from(s, last_i + 1)).trim_matches(py_space).is_empty() {
                    return Err(Raised::Assertion);
                }
                Ok((text(s), closing(&self.stack)))
            }
            '[' | '{' => self.fixed_from(last_i, self.outer()),
            // The last token closed a string.
            _ if top_c == '[' => Ok((text(s), closing(&self.stack))),
            _ => self.after_string_in_object(top_at),
        }
    }

    /// An object whose last token closed a key or a value.
    fn after_string_in_object(&self, top_at: isize) -> Result<Fixed, Raised> {
        let s = self.s;
        let colon = rfind(s, ":", self.lse, s.len() as isize);
        let comma = rfind(s, ",", top_at + 1, self.lss);
        if comma == -1 {
            return self.fixed_from(top_at, self.outer());
        }
        let mut probe = vec!['{'];
        probe.extend_from_slice(from(s, comma + 1));
        if colon == -1 {
            if rfind(s, ":", top_at.max(comma) + 1, self.lss) != -1 {
                return Ok((text(s), closing(&self.stack)));
            }
            // Python closes the whole stack here when the last pair is kept.
            let (h, t) = fix(&probe, self.strings, false)?;
            if text(from(&h, 1)).is_empty() && trim_tail(&t).is_empty() {
                return Ok((text(upto(s, comma)), t + &closing(self.outer())));
            }
            let head = text(upto(s, comma + 1)) + &text(from(&h, 1));
            return Ok((head, t + &closing(&self.stack)));
        }
        if colon <= comma {
            return Err(Raised::Assertion);
        }
        rejoin(s, comma, &probe, self.strings, self.outer())
    }
}

/// `tail[:-1].strip()`.
fn trim_tail(t: &str) -> String {
    let c: Vec<char> = t.chars().collect();
    text(upto(&c, -1)).trim_matches(py_space).to_string()
}

/// The last item after `comma` fixed on its own (`probe`: it behind its container's
/// opener) and joined back, the comma dropped where nothing of it is kept.
fn rejoin(
    s: &[char],
    comma: isize,
    probe: &[char],
    strings: bool,
    rest: &[(isize, char)],
) -> Result<Fixed, Raised> {
    let (h, t) = fix(probe, strings, false)?;
    let item = text(from(&h, 1));
    if item.is_empty() && trim_tail(&t).is_empty() {
        return Ok((text(upto(s, comma)) + &item, t + &closing(rest)));
    }
    Ok((text(upto(s, comma + 1)) + &item, t + &closing(rest)))
}

/// `truncate_before_last_key_start`: cut an object before the key being written.
fn before_last_key(
    s: &[char],
    container_start: isize,
    last_string_end: isize,
    stack: &[(isize, char)],
) -> Result<Fixed, Raised> {
    let mut key = last_string_end;
    loop {
        key = rfind(s, "\"", container_start, key);
        if key == -1 {
            return Ok((text(upto(s, container_start + 1)), closing(stack)));
        }
        if escaped(s, key) {
            key -= 1;
            continue;
        }
        let comma = rfind(s, ",", container_start, key);
        if comma == -1 {
            return Ok((text(upto(s, container_start + 1)), closing(stack)));
        }
        return Ok((text(upto(s, comma)), closing(stack)));
    }
}

#[cfg(test)]
mod tests;
