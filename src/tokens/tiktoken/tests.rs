use super::*;

/// A Kimi-shaped folder: ranks 0..255 are the bytes, then a few merges; the special
/// tokens follow the ranks, two named in `added_tokens_decoder`, the rest reserved.
/// `tag` keeps the folders of tests running side by side apart.
fn kimi_like(tag: &str, class: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specd-tiktoken-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for t in [
        "th", "the", "in", "ing", " th", " the", "é", "caf", "café", "数字",
    ] {
        tokens.push(t.as_bytes().to_vec());
    }
    let lines: String = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{} {i}\n", b64.encode(t)))
        .collect();
    std::fs::write(dir.join(RANKS_FILE), lines).expect("write");
    let n = tokens.len();
    let cfg = serde_json::json!({
        "added_tokens_decoder": {
            n.to_string(): {"content": "[BOS]", "special": true},
            (n + 1).to_string(): {"content": "<|im_end|>", "special": true},
        },
        "bos_token": "[BOS]",
        "eos_token": "<|im_end|>",
        "auto_map": {"AutoTokenizer": ["tokenization_x.TikTokenTokenizer", null]},
    });
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    std::fs::write(dir.join("tokenization_x.py"), class).expect("write");
    dir
}

const KIMI_CLASS: &str = r#"
class TikTokenTokenizer(PreTrainedTokenizer):
    special_tokens: Dict[str, int]

    num_reserved_special_tokens = 4

    pat_str = "|".join(
        [
            r"""[\p{Han}]+""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",  # the rest
        ]
    )
"#;

fn ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, false).expect("encode").get_ids().to_vec()
}

#[test]
fn kimis_pattern_is_read_from_its_class() {
    let s = class_settings(Path::new("."), &serde_json::json!({}));
    // No auto_map in this config: the defaults.
    assert_eq!(s.pattern, KIMI_PATTERN);
    assert_eq!(s.pattern_from, None);
    let dir = kimi_like("kimis_pattern_is_read_from_its_class", KIMI_CLASS);
    let (_, s) = load(&dir).expect("load");
    assert_eq!(s.pattern, KIMI_PATTERN);
    assert_eq!(s.reserved, 4);
    assert_eq!(s.pattern_from, Some(dir.join("tokenization_x.py")));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn python_literals_in_their_common_shapes() {
    let code =
        "x = 1\npat_str = r'a\\p{L}' \"b\\n\"  # c\nnum_reserved_special_tokens: int = 1_024\n";
    assert_eq!(
        pysource::string_assignment(code, "pat_str").as_deref(),
        Some("a\\p{L}b\n")
    );
    assert_eq!(
        pysource::int_assignment(code, "num_reserved_special_tokens"),
        Some(1024)
    );
    let joined = "pat_str = '|'.join((\n  'a',  # one\n  ('b'\n   'c'),\n))\n";
    assert_eq!(
        pysource::string_assignment(joined, "pat_str").as_deref(),
        Some("a|bc")
    );
    assert_eq!(
        pysource::string_assignment("pat_str = PATTERN\n", "pat_str"),
        None
    );
    assert_eq!(
        pysource::string_assignment("pat_string = 'x'\n", "pat_str"),
        None
    );
    assert_eq!(
        pysource::string_assignment("if pat_str == 'x':\n", "pat_str"),
        None
    );
    let annotated = "pat_str: str\nself.pat_str = 'no'\npat_str: str = 'yes'\n";
    assert_eq!(
        pysource::string_assignment(annotated, "pat_str").as_deref(),
        Some("yes")
    );
}

#[test]
fn merges_follow_the_ranks_and_whole_pieces_win() {
    let dir = kimi_like("merges_follow_the_ranks_and_whole_pieces_win", KIMI_CLASS);
    let (tok, _) = load(&dir).expect("load");
    let id = |t: &str| {
        tok.token_to_id(
            &t.bytes()
                .map(|b| byte_chars()[b as usize])
                .collect::<String>(),
        )
    };
    let the = id("the").expect("the");
    let sp_the = id(" the").expect(" the");
    let ing = id("ing").expect("ing");
    // "the" and " the" are whole pieces; " thing" merges th, in, ing by rank.
    assert_eq!(ids(&tok, "the the"), vec![the, sp_the]);
    let th_sp = id(" th").expect(" th");
    assert_eq!(ids(&tok, " thing"), vec![th_sp, ing]);
    assert_eq!(ids(&tok, "数字"), vec![id("数字").expect("han")]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn special_and_reserved_tokens_keep_their_ids() {
    let dir = kimi_like("special_and_reserved_tokens_keep_their_ids", KIMI_CLASS);
    let (tok, _) = load(&dir).expect("load");
    let n = 266u32;
    assert_eq!(tok.token_to_id("[BOS]"), Some(n));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(n + 1));
    // Kimi fills the ids after the highest rank that added_tokens_decoder leaves out.
    assert_eq!(
        tok.token_to_id(&format!("<|reserved_token_{}|>", n + 2)),
        Some(n + 2)
    );
    assert_eq!(
        tok.token_to_id(&format!("<|reserved_token_{}|>", n + 3)),
        Some(n + 3)
    );
    assert_eq!(
        tok.token_to_id(&format!("<|reserved_token_{}|>", n + 4)),
        None
    );
    assert_eq!(tok.get_vocab_size(true), n as usize + 4);
    let text = format!("[BOS]hi<|im_end|><|reserved_token_{}|> ok", n + 3);
    let got = ids(&tok, &text);
    assert_eq!(got[0], n);
    assert!(got.contains(&(n + 1)) && got.contains(&(n + 3)), "{got:?}");
    assert_eq!(tok.decode(&got, false).expect("decode"), text);
    // Reserved ids are text to the class, as vLLM shows them.
    assert_eq!(
        tok.decode(&got, true).expect("decode"),
        format!("hi<|reserved_token_{}|> ok", n + 3)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn non_ascii_text_round_trips_byte_for_byte() {
    let dir = kimi_like("non_ascii_text_round_trips_byte_for_byte", KIMI_CLASS);
    let (tok, _) = load(&dir).expect("load");
    for text in [
        "naïve café, Grüße — 数字 ✓ ½ 12345 6.02e23\n\tdef f(x):\n        return x  # done\n",
        "🦀 \u{0}\u{7f}\r\n  \n",
    ] {
        let got = ids(&tok, text);
        assert_eq!(tok.decode(&got, false).expect("decode"), text);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_rank_files_name_the_line() {
    assert_eq!(
        parse_ranks("YQ== 0\nYg== x\n").map(|_| ()),
        Err((2, "rank: invalid digit found in string".into()))
    );
    assert!(parse_ranks("").is_err());
    assert!(parse_ranks("YQ== 0\nYg== 0\n").is_err(), "a rank twice");
    assert!(parse_ranks("YQ== 0\nYQ== 1\n").is_err(), "a token twice");
    assert!(parse_ranks("!!! 3").is_err());
    assert_eq!(parse_ranks("\nYQ== 0\n").map(|r| r.len()), Ok(1));
}

#[test]
fn a_piece_bpe_cannot_reach_is_still_taken_whole() {
    let mut ranks: HashMap<&[u8], u32> = HashMap::new();
    ranks.insert(b"a", 0);
    ranks.insert(b"b", 1);
    ranks.insert(b"c", 2);
    ranks.insert(b"bc", 3);
    ranks.insert(b"abc", 4);
    ranks.insert(b"ab", 5);
    // BPE below rank 4 gives a + bc: the merge of abc.
    assert_eq!(last_merge(b"abc", 4, &ranks), Some((&b"a"[..], &b"bc"[..])));
    assert_eq!(last_merge(b"ab", 5, &ranks), Some((&b"a"[..], &b"b"[..])));
    assert_eq!(last_merge(b"a", 0, &ranks), None);
}

#[test]
fn bos_and_eos_follow_the_config() {
    let dir = kimi_like("bos_and_eos_follow_the_config", KIMI_CLASS);
    let base: Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer_config.json")).expect("read"))
            .expect("json");
    let with = |extra: Value| {
        let mut cfg = base.clone();
        if let (Some(o), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
        let (tok, _) = load(&dir).expect("load");
        tok.encode("the", true).expect("encode").get_ids().to_vec()
    };
    let the = with(serde_json::json!({}));
    assert_eq!(the.len(), 1, "Kimi's own: no BOS");
    let (bos, eos) = (266, 267);
    assert_eq!(
        with(serde_json::json!({"add_bos_token": true})),
        vec![bos, the[0]]
    );
    assert_eq!(
        with(serde_json::json!({"special_tokens_pattern": "bos_eos"})),
        vec![bos, the[0], eos]
    );
    assert_eq!(
        with(serde_json::json!({"add_eos_token": true})),
        vec![the[0], eos]
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_special_token_on_a_rank_is_refused() {
    let dir = kimi_like("a_special_token_on_a_rank_is_refused", KIMI_CLASS);
    let cfg = serde_json::json!({"added_tokens_decoder": {"65": {"content": "<|x|>"}}});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    let err = load(&dir)
        .map(|_| ())
        .expect_err("id 65 is the rank of `A`");
    assert!(err.to_string().contains("which is a rank"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn listed_special_tokens_decide_what_is_skipped() {
    let dir = kimi_like("listed_special_tokens_decide_what_is_skipped", KIMI_CLASS);
    let cfg = serde_json::json!({
        "added_tokens_decoder": {
            "266": {"content": "[BOS]", "special": true},
            "267": {"content": "<|im_end|>", "special": true},
            "268": {"content": "<|tool|>", "special": true},
        },
        "bos_token": {"content": "[BOS]"},
        "additional_special_tokens": ["<|im_end|>"],
    });
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    let (tok, _) = load(&dir).expect("load");
    let got = ids(&tok, "[BOS]a<|im_end|>b<|tool|>");
    assert_eq!(tok.decode(&got, true).expect("decode"), "ab<|tool|>");
    let _ = std::fs::remove_dir_all(dir);
}
