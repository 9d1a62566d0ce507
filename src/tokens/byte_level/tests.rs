use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::*;

/// A ByteLevel BPE tokenizer: the 256 byte tokens, tokens of several bytes (a character
/// and its parts), one not written in the byte map, and added tokens special or not.
fn tokenizer() -> Tokenizer {
    let map = char_to_byte();
    let mut byte_chars = vec![' '; 256];
    for c in (0..400u32).filter_map(char::from_u32) {
        if let Some(b) = map(c) {
            byte_chars[b as usize] = c;
        }
    }
    let written =
        |bytes: &[u8]| -> String { bytes.iter().map(|&b| byte_chars[b as usize]).collect() };
    let mut vocab: Map<String, Value> = Map::new();
    for b in 0..=255u8 {
        vocab.insert(written(&[b]), vocab.len().into());
    }
    for word in [
        " hello",
        "\u{e9}",
        "\u{4f60}",
        "\u{1f600}",
        " \u{4f60}\u{597d}",
    ] {
        vocab.insert(written(word.as_bytes()), vocab.len().into());
    }
    // Parts of a character: its first two bytes, its last two.
    vocab.insert(written(&"\u{4f60}".as_bytes()[..2]), vocab.len().into());
    vocab.insert(written(&"\u{1f600}".as_bytes()[2..]), vocab.len().into());
    vocab.insert("日本".into(), vocab.len().into());
    let n = vocab.len();
    let json = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [
            {"id": n, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": n + 1, "content": "<tool>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false},
            {"id": n + 3, "content": "<|gap|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": []}
    });
    json.to_string().parse().expect("tokenizer json")
}

/// The table's stream gives what `DecodeStream` gives, token by token.
fn same_as_decode_stream(tok: &Tokenizer, table: &ByteTable, ids: &[u32], skip_special: bool) {
    let mut reference = tok.decode_stream(skip_special);
    let mut ours = ByteStream::new(table, skip_special);
    for &id in ids {
        let want = reference.step(id).map_err(|e| e.to_string());
        let got = ours.step(id).map_err(|_| "invalid prefix".to_string());
        assert_eq!(got.is_ok(), want.is_ok(), "{ids:?} at {id}");
        if let (Ok(g), Ok(w)) = (got, want) {
            assert_eq!(g, w, "{ids:?} at {id}");
        }
    }
}

#[test]
fn a_byte_level_tokenizer_has_a_table_and_others_none() {
    assert!(ByteTable::of(&tokenizer()).is_some());
    let word_level = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}
    });
    let t: Tokenizer = word_level.to_string().parse().expect("tokenizer json");
    assert!(ByteTable::of(&t).is_none());
}

#[test]
fn characters_split_across_tokens_and_specials() {
    let tok = tokenizer();
    let table = ByteTable::of(&tok).expect("byte level");
    let n = 256 + 8;
    let cases: [&[u32]; 5] = [
        &[256, 257, 258, 259, 260],
        // 你 as its first two bytes and its last, then 😀 as its first two bytes and the rest.
        &[261, 0xA0, 0xF0, 0x9F, 262, 256],
        &[n, 256, n + 1, n + 2, n + 3, 263, 0xE4],
        &[0xFF, 0xFE, 256, 0x80, 0x80, 257],
        &[0xE4, 0xBD, n, 0xA0, 256],
    ];
    for ids in cases {
        for skip in [false, true] {
            same_as_decode_stream(&tok, &table, ids, skip);
        }
    }
}

proptest! {
    #[test]
    fn any_ids_decode_as_decode_stream_does(
        ids in proptest::collection::vec(0u32..272, 0..40),
        skip in any::<bool>(),
    ) {
        let tok = tokenizer();
        let table = ByteTable::of(&tok).expect("byte level");
        same_as_decode_stream(&tok, &table, &ids, skip);
    }
}
