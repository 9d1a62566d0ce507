use super::*;

fn ids(ids: &[u32]) -> RelayChunk {
    RelayChunk::Samples(ids.iter().map(|&i| Sample::id(i)).collect())
}

fn lp(id: u32, logprob: Option<f32>, top: &[(u32, f32)]) -> Sample {
    Sample {
        id,
        logprob,
        top: top.to_vec(),
    }
}

/// Each kind of chunk reads as what it says, asked for top logprobs or not.
#[test]
fn chunks_read_as_they_say() {
    let cases: &[(&str, RelayChunk)] = &[
        (
            r#"{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a","logprobs":{"text_offset":[0],"token_logprobs":[-0.25],"tokens":["token_id:17"],"top_logprobs":null},"finish_reason":null,"stop_reason":null}],"usage":null}"#,
            RelayChunk::Samples(vec![lp(17, Some(-0.25), &[])]),
        ),
        (
            r#"{"choices":[{"index":0,"text":"ab","logprobs":null,"token_ids":[7,9]}]}"#,
            ids(&[7, 9]),
        ),
        (
            r#"{"choices":[{"text":"x","logprobs":{"tokens":["token_id:3","token_id:4"],"token_logprobs":[null,1]}}]}"#,
            RelayChunk::Samples(vec![lp(3, None, &[]), lp(4, Some(1.0), &[])]),
        ),
        (
            r#"{"choices":[{"text":"x","logprobs":{"tokens":["bad"]}}]}"#,
            RelayChunk::NoIds,
        ),
        (
            r#"{"choices":[{"text":"x","token_ids":[4294967296]}]}"#,
            RelayChunk::NoIds,
        ),
        (
            r#"{"choices":[{"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":3}}"#,
            RelayChunk::Empty,
        ),
        (r#"{"choices":[{"text":"x"}]}"#, RelayChunk::NoIds),
        (
            r#"{"choices":[],"usage":{"completion_tokens":4}}"#,
            RelayChunk::Empty,
        ),
        (r#"{"choices":null}"#, RelayChunk::Empty),
        (
            r#"{"error":{"message":"boom","code":500}}"#,
            RelayChunk::Error("boom".into()),
        ),
        (
            r#"{"error":{"message":"b\u00f6\"om"},"choices":[{"token_ids":[1]}]}"#,
            RelayChunk::Error("b\u{f6}\"om".into()),
        ),
        (
            r#"{"choices":[{"text":"\u00e9\n","token_ids":[1]}]}"#,
            ids(&[1]),
        ),
        // Fields of unexpected types count as absent.
        (
            r#"{"error":{"message":7},"choices":[{"token_ids":[1]}]}"#,
            ids(&[1]),
        ),
        (
            r#"{"error":"text","choices":[{"token_ids":[1]}]}"#,
            ids(&[1]),
        ),
        (
            r#"{"choices":[{"text":"x","token_ids":[-1]}]}"#,
            RelayChunk::NoIds,
        ),
        (
            r#"{"choices":[{"text":"x","token_ids":[2.0]}]}"#,
            RelayChunk::NoIds,
        ),
        (r#"{"choices":[{"text":5,"token_ids":[1]}]}"#, ids(&[1])),
        (
            r#"{"choices":[{"text":"","logprobs":5,"token_ids":[1]}]}"#,
            RelayChunk::Empty,
        ),
        (
            r#"{"choices":[{"text":"x","logprobs":[],"token_ids":[1]}]}"#,
            RelayChunk::NoIds,
        ),
        (r#"{"choices":[7,{"token_ids":[1]}]}"#, RelayChunk::Empty),
        (r#"{"choices":"x"}"#, RelayChunk::Empty),
        (r#"[{"choices":[{"token_ids":[1]}]}]"#, RelayChunk::Empty),
        (r#""text""#, RelayChunk::Empty),
        // `choices` as an object is read at its "0" key.
        (
            r#"{"choices":{"0":{"text":"x","token_ids":[5]}}}"#,
            ids(&[5]),
        ),
        // A repeated key counts by its last value.
        (
            r#"{"choices":[{"token_ids":[1]}],"choices":[{"token_ids":[2]}]}"#,
            ids(&[2]),
        ),
        (
            r#"{"choices":[{"token_ids":[1],"logprobs":{"tokens":["token_id:4"]},"logprobs":null}]}"#,
            ids(&[1]),
        ),
    ];
    for (chunk, want) in cases {
        for want_top in [false, true] {
            assert_eq!(read(chunk, want_top).ok().as_ref(), Some(want), "{chunk}");
        }
    }
}

/// Top logprobs are read only when asked: each entry's ids most likely first (ties in the
/// order of their keys), a repeated key by its last value, entries not `token_id:N` or not
/// a number left out.
#[test]
fn top_logprobs_when_asked() {
    let chunk = r#"{"choices":[{"text":"ab","logprobs":{
        "tokens":["token_id:3","token_id:4","token_id:5"],
        "token_logprobs":[-0.5,-1,-2],
        "top_logprobs":[
            {"token_id:9":-1.5,"token_id:3":-0.5,"bad":0,"token_id:1":-0.5,"token_id:2":"x"},
            {"token_id:4":-3,"token_id:4":-1},
            null
        ]}}]}"#;
    assert_eq!(
        read(chunk, true).ok(),
        Some(RelayChunk::Samples(vec![
            lp(3, Some(-0.5), &[(1, -0.5), (3, -0.5), (9, -1.5)]),
            lp(4, Some(-1.0), &[(4, -1.0)]),
            lp(5, Some(-2.0), &[]),
        ]))
    );
    assert_eq!(
        read(chunk, false).ok(),
        Some(RelayChunk::Samples(vec![
            lp(3, Some(-0.5), &[]),
            lp(4, Some(-1.0), &[]),
            lp(5, Some(-2.0), &[]),
        ]))
    );
}

#[test]
fn only_json_that_does_not_parse_is_an_error() {
    for bad in [
        "{not json",
        r#"{"choices":[]} x"#,
        r#"{"choices":[{"token_ids":[1}]}"#,
        "",
    ] {
        assert!(read(bad, false).is_err(), "{bad}");
    }
}
