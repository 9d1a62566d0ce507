//! `partial_json_parser.loads` (0.2.1, its default `fix_fast`) as SGLang's tool parsers
//! call it (`function_call/utils.py` `_partial_json_loads`): an unfinished JSON text is
//! completed (open strings, objects and arrays closed; a trailing key without its value
//! dropped) and read with `json.loads`; a complete value followed by more text is read
//! with `raw_decode`. Indices are in characters, as Python's.

use super::pyjson::{self, PyValue};

/// Which partial values may be completed: everything, or everything but strings (what
/// SGLang allows until a call's name is sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allow {
    pub strings: bool,
}

/// Why a text gave no value. Every failure reads the same to SGLang's parser (an empty
/// step), so they are not told apart.
#[derive(Debug)]
pub struct Failed;

/// `_partial_json_loads(text, flags)`: the value and the characters it took.
pub fn loads(text: &str, allow: Allow) -> Result<(PyValue, usize), Failed> {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len();
    match fix_fast(&chars, allow) {
        Ok(s) => {
            match pyjson::loads(&s) {
                Some(v) => Ok((v, n)),
                // `json.loads` raises "Extra data" when a value ends before the text.
                None if pyjson::raw_decode(s.trim_start_matches(WS)).is_some() => {
                    raw_decode_at(&chars)
                }
                None => Err(Failed),
            }
        }
        // "pop from empty list": an unbalanced closer.
        Err(Fix::Pop) => raw_decode_at(&chars),
        Err(Fix::Failed) => Err(Failed),
    }
}

const WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// `JSONDecoder().raw_decode(text, WHITESPACE.match(text).end())`.
fn raw_decode_at(chars: &[char]) -> Result<(PyValue, usize), Failed> {
    let start = chars.iter().take_while(|c| WS.contains(c)).count();
    let rest: String = chars[start..].iter().collect();
    let (v, bytes) = pyjson::raw_decode(&rest).ok_or(Failed)?;
    Ok((v, start + rest[..bytes].chars().count()))
}

enum Fix {
    Pop,
    Failed,
}

impl From<Failed> for Fix {
    fn from(_: Failed) -> Self {
        Fix::Failed
    }
}

/// Python's `s.rfind(pat, start, end)` on characters, with its negative and clamped
/// bounds; -1 where not found.
fn rfind(s: &[char], pat: &str, start: isize, end: Option<isize>) -> isize {
    let n = s.len() as isize;
    let norm = |x: isize| if x < 0 { (n + x).max(0) } else { x.min(n) };
    let (a, b) = (norm(start), norm(end.unwrap_or(n)));
    let p: Vec<char> = pat.chars().collect();
    let m = p.len() as isize;
    let mut i = b - m;
    while i >= a {
        if s[i as usize..(i + m) as usize] == p[..] {
            return i;
        }
        i -= 1;
    }
    -1
}

fn closing(stack: &[(usize, char)]) -> String {
    stack
        .iter()
        .rev()
        .map(|&(_, c)| if c == '{' { '}' } else { ']' })
        .collect()
}

fn is_escaped(s: &[char], index: usize) -> bool {
    s[..index].iter().rev().take_while(|&&c| c == '\\').count() % 2 == 1
}

fn is_blank(s: &[char]) -> bool {
    s.iter().all(|c| c.is_whitespace())
}

fn text(s: &[char]) -> String {
    s.iter().collect()
}

/// `fix_fast`: the completed text (`head + tail`).
fn fix_fast(s: &[char], allow: Allow) -> Result<String, Fix> {
    let tokens: Vec<(usize, char)> = s
        .iter()
        .enumerate()
        .filter(|(_, c)| matches!(c, '"' | '[' | ']' | '{' | '}'))
        .map(|(i, &c)| (i, c))
        .collect();
    if tokens.first().is_none_or(|t| t.1 == '"') {
        let (head, tail) = fix(s, allow, true)?;
        return Ok(text(&s[..head]) + &tail);
    }
    let mut stack: Vec<(usize, char)> = Vec::new();
    let mut in_string = false;
    let (mut last_start, mut last_end) = (-1isize, -1isize);
    for &(i, c) in &tokens {
        if c == '"' {
            if !in_string {
                in_string = true;
                last_start = i as isize;
            } else if !is_escaped(s, i) {
                in_string = false;
                last_end = i as isize;
            }
        } else if !in_string {
            match c {
                '}' | ']' => {
                    let (_, open) = stack.pop().ok_or(Fix::Pop)?;
                    let want = if c == '}' { '{' } else { '[' };
                    if open != want {
                        return Err(Fix::Failed);
                    }
                }
                _ => stack.push((i, c)),
            }
        }
    }
    if stack.is_empty() {
        return Ok(text(s));
    }
    let top = *stack.last().ok_or(Fix::Failed)?;
    let all = closing(&stack);
    let parent = closing(&stack[..stack.len() - 1]);
    if !allow.strings && in_string {
        if top.0 as isize > last_end && top.1 == '{' {
            return Ok(text(&s[..=top.0]) + &all);
        }
        let from = (top.0 as isize).max(last_end) + 1;
        let comma = rfind(s, ",", from, Some(last_start));
        if comma != -1 {
            return Ok(text(&s[..comma as usize]) + &all);
        }
        return Ok(before_last_key(s, top.0, last_end, &stack));
    }
    if in_string {
        return in_open_string(s, allow, &stack, last_start, last_end);
    }
    // The loop's last token is the last quote or bracket of the text.
    let (li, lc) = *tokens.last().ok_or(Fix::Failed)?;
    let comma = rfind(s, ",", last_end.max(li as isize) + 1, None);
    if comma != -1 {
        let comma = comma as usize;
        if is_blank(&s[comma + 1..]) {
            return Ok(text(&s[..comma]) + &all);
        }
        if top.1 != '[' {
            return Err(Fix::Failed);
        }
        return rejoin(s, allow, comma, '[', &parent, &parent);
    }
    if matches!(lc, ']' | '}') {
        if !is_blank(&s[li + 1..]) {
            return Err(Fix::Failed);
        }
        return Ok(text(s) + &all);
    }
    if matches!(lc, '[' | '{') {
        let (head, tail) = fix(&s[li..], allow, false)?;
        return Ok(text(&s[..li + head]) + &tail + &parent);
    }
    // The last token is a closing quote.
    let (i, c) = top;
    if c == '[' {
        return Ok(text(s) + &all);
    }
    let colon = rfind(s, ":", last_end, None);
    let comma = rfind(s, ",", i as isize + 1, Some(last_start));
    if comma == -1 {
        let (head, tail) = fix(&s[i..], allow, false)?;
        return Ok(text(&s[..i + head]) + &tail + &parent);
    }
    if colon == -1 {
        let from = i.max(comma as usize) as isize + 1;
        if rfind(s, ":", from, Some(last_start)) != -1 {
            return Ok(text(s) + &all);
        }
        return rejoin(s, allow, comma as usize, '{', &parent, &all);
    }
    if colon <= comma {
        return Err(Fix::Failed);
    }
    rejoin(s, allow, comma as usize, '{', &parent, &parent)
}

/// `_fix(open + s[comma+1:])` spliced back without the comma when it adds nothing
/// (then `empty_close` follows), else after it (then `close`).
fn rejoin(
    s: &[char],
    allow: Allow,
    comma: usize,
    open: char,
    empty_close: &str,
    close: &str,
) -> Result<String, Fix> {
    let mut piece = vec![open];
    piece.extend_from_slice(&s[comma + 1..]);
    let (head, tail) = fix(&piece, allow, false)?;
    let inner = text(&piece[1..head.max(1)]);
    let n = tail.chars().count();
    let tail_inner: String = tail.chars().take(n.saturating_sub(1)).collect();
    if inner.is_empty() && tail_inner.trim().is_empty() {
        return Ok(text(&s[..comma]) + &inner + &tail + empty_close);
    }
    Ok(text(&s[..=comma]) + &inner + &tail + close)
}

/// `truncate_before_last_key_start`.
fn before_last_key(
    s: &[char],
    container: usize,
    last_end: isize,
    stack: &[(usize, char)],
) -> String {
    let mut key = last_end;
    loop {
        key = rfind(s, "\"", container as isize, Some(key));
        if key == -1 {
            return text(&s[..=container]) + &closing(stack);
        }
        if is_escaped(s, key as usize) {
            key -= 1;
            continue;
        }
        let comma = rfind(s, ",", container as isize, Some(key));
        if comma == -1 {
            return text(&s[..=container]) + &closing(stack);
        }
        return text(&s[..comma as usize]) + &closing(stack);
    }
}

/// `fix_fast` where the text ends inside a string (strings allowed).
fn in_open_string(
    s: &[char],
    allow: Allow,
    stack: &[(usize, char)],
    last_start: isize,
    last_end: isize,
) -> Result<String, Fix> {
    let top = stack[stack.len() - 1];
    let ls = last_start as usize;
    if top.1 == '[' {
        let (head, tail) = fix(&s[ls..], allow, false)?;
        return Ok(text(&s[..ls + head]) + &tail + &closing(stack));
    }
    let start = last_end.max(top.0 as isize);
    let between = &s[(start + 1) as usize..ls];
    if between.contains(&',') {
        let comma = rfind(s, ",", start, Some(last_start)) as usize;
        let mut piece = vec!['{'];
        piece.extend_from_slice(&s[comma + 1..]);
        let (head, tail) = fix(&piece, allow, false)?;
        let inner = text(&piece[1..head.max(1)]);
        return Ok(text(&s[..comma]) + &inner + &tail + &closing(&stack[..stack.len() - 1]));
    }
    if between.contains(&':') {
        let (head, tail) = fix(&s[ls..], allow, false)?;
        return Ok(text(&s[..ls + head]) + &tail + &closing(stack));
    }
    Ok(text(&s[..ls]) + &closing(stack))
}

/// `_fix(s, allow, is_top_level)`: `complete_any` of the stripped text, its index
/// applied to the unstripped text (as Python does).
fn fix(s: &[char], allow: Allow, top: bool) -> Result<(usize, String), Fix> {
    let a = s.iter().take_while(|c| c.is_whitespace()).count();
    let b = s.len() - s.iter().rev().take_while(|c| c.is_whitespace()).count();
    let stripped = if a < b { &s[a..b] } else { &s[0..0] };
    match complete_any(stripped, allow, top) {
        Ok(Some((index, completion))) => Ok((index.min(s.len()), completion.unwrap_or_default())),
        _ => Err(Fix::Failed),
    }
}

/// `(index, None)`: complete; `(index, Some(c))`: partial, completed by `c`.
type Done = Option<(usize, Option<String>)>;

#[derive(Debug)]
enum E {
    Index,
    Malformed,
}

fn starts(s: &[char], word: &str) -> bool {
    let w: Vec<char> = word.chars().collect();
    s.len() >= w.len() && s[..w.len()] == w[..]
}

fn is_prefix_of(s: &[char], word: &str) -> bool {
    let w: Vec<char> = word.chars().collect();
    s.len() <= w.len() && w[..s.len()] == s[..]
}

fn complete_any(s: &[char], allow: Allow, top: bool) -> Result<Done, E> {
    let i = s.iter().take_while(|c| c.is_whitespace()).count();
    let c = *s.get(i).ok_or(E::Index)?;
    match c {
        '"' => return complete_str(s, allow),
        '0'..='9' => return Ok(complete_num(s, top)),
        '[' => return complete_arr(s, allow),
        '{' => return complete_obj(s, allow),
        _ => {}
    }
    for (word, len) in [("null", 4), ("true", 4), ("false", 5), ("Infinity", 8)] {
        if starts(s, word) {
            return Ok(Some((len, None)));
        }
        if is_prefix_of(s, word) {
            return Ok(Some((0, Some(word.to_string()))));
        }
    }
    if c == '-' {
        match s.get(1) {
            None => return Ok(None),
            Some(&n) if n != 'I' => return Ok(complete_num(s, top)),
            _ => {}
        }
    }
    for (word, len) in [("-Infinity", 9), ("NaN", 3)] {
        if starts(s, word) {
            return Ok(Some((len, None)));
        }
        if is_prefix_of(s, word) {
            return Ok(Some((0, Some(word.to_string()))));
        }
    }
    Err(E::Malformed)
}

fn complete_str(s: &[char], allow: Allow) -> Result<Done, E> {
    if s.first() != Some(&'"') {
        return Err(E::Malformed);
    }
    let n = s.len();
    let mut i = 1;
    while i < n {
        match s[i] {
            '\\' if i + 1 == n => break,
            '\\' => i += 2,
            '"' => return Ok(Some((i + 1, None))),
            _ => i += 1,
        }
    }
    if !allow.strings {
        return Ok(None);
    }
    let not_escaped = |at: usize| !is_escaped(s, at);
    let i = i.min(n);
    for (pat, back) in [("\\u", 5), ("\\U", 9), ("\\x", 3)] {
        let at = rfind(s, pat, (i as isize - back).max(0), Some(i as isize));
        if at != -1 && not_escaped(at as usize) {
            return Ok(Some((at as usize, Some("\"".into()))));
        }
    }
    Ok(Some((i, Some("\"".into()))))
}

fn skip_blank(s: &[char], mut j: usize) -> usize {
    while j < s.len() && s[j].is_whitespace() {
        j += 1;
    }
    j
}

fn complete_arr(s: &[char], allow: Allow) -> Result<Done, E> {
    let mut last_i = 1;
    match arr_body(s, allow, &mut last_i) {
        Err(E::Index) => Ok(Some((last_i, Some("]".into())))),
        r => r,
    }
}

fn arr_body(s: &[char], allow: Allow, i: &mut usize) -> Result<Done, E> {
    let mut j = 1;
    loop {
        j = skip_blank(s, j);
        if *s.get(j).ok_or(E::Index)? == ']' {
            return Ok(Some((j + 1, None)));
        }
        match complete_any(&s[j..], allow, false)? {
            None => return Ok(Some((*i, Some("]".into())))),
            Some((k, None)) => {
                j += k;
                *i = j;
            }
            Some((k, Some(c))) => return Ok(Some((j + k, Some(c + "]")))),
        }
        j = skip_blank(s, j);
        match *s.get(j).ok_or(E::Index)? {
            ',' => j += 1,
            ']' => return Ok(Some((j + 1, None))),
            _ => return Err(E::Malformed),
        }
    }
}

fn complete_obj(s: &[char], allow: Allow) -> Result<Done, E> {
    let mut last_i = 1;
    match obj_body(s, allow, &mut last_i) {
        Err(E::Index) => Ok(Some((last_i, Some("}".into())))),
        r => r,
    }
}

fn obj_body(s: &[char], allow: Allow, i: &mut usize) -> Result<Done, E> {
    let mut j = 1;
    loop {
        j = skip_blank(s, j);
        if *s.get(j).ok_or(E::Index)? == '}' {
            return Ok(Some((j + 1, None)));
        }
        match complete_str(&s[j..], allow)? {
            Some((k, None)) => j += k,
            _ => return Ok(Some((*i, Some("}".into())))),
        }
        j = skip_blank(s, j);
        if *s.get(j).ok_or(E::Index)? != ':' {
            return Err(E::Malformed);
        }
        j = skip_blank(s, j + 1);
        match complete_any(s.get(j..).unwrap_or(&[]), allow, false)? {
            None => return Ok(Some((*i, Some("}".into())))),
            Some((k, None)) => {
                j += k;
                *i = j;
            }
            Some((k, Some(c))) => return Ok(Some((j + k, Some(c + "}")))),
        }
        j = skip_blank(s, j);
        match *s.get(j).ok_or(E::Index)? {
            ',' => j += 1,
            '}' => return Ok(Some((j + 1, None))),
            _ => return Err(E::Malformed),
        }
    }
}

fn complete_num(s: &[char], top: bool) -> Done {
    let n = s.len();
    let num = |c: char| "1234567890.-+eE".contains(c);
    let mut i = 1;
    while i < n && num(s[i]) {
        i += 1;
    }
    let mut modified = false;
    while i > 0 && ".-+eE".contains(s[i - 1]) {
        modified = true;
        i -= 1;
    }
    if modified || (i == n && !top) {
        Some((i, Some(String::new())))
    } else {
        Some((i, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(s: &str, strings: bool) -> Option<String> {
        loads(s, Allow { strings })
            .ok()
            .map(|(v, _)| pyjson::dumps(&v))
    }

    #[test]
    fn completes_as_partial_json_parser() {
        assert_eq!(read("{\"a\": \"O", true).as_deref(), Some("{\"a\": \"O\"}"));
        assert_eq!(read("{\"a\": \"O", false).as_deref(), Some("{}"));
        assert_eq!(read("{\"a\": 1", true).as_deref(), Some("{\"a\": 1}"));
        assert_eq!(
            read("{\"a\": {\"b\": [1, 2", true).as_deref(),
            Some("{\"a\": {\"b\": [1, 2]}}")
        );
        let (_, end) = loads("{\"a\": 1}\n</tool_call>", Allow { strings: true }).expect("value");
        assert_eq!(end, 8);
    }
}
