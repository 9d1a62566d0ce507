//! The checks vLLM makes on a tokenized prompt before generating, with vLLM's own error
//! messages (clients match on them). Mirrored from vLLM: the context length and
//! `max_tokens` against the context from vllm/renderers/params.py (the prompt message in
//! the wording of earlier releases, which clients already match), and
//! `stop_token_ids` out of vocabulary from vllm/sampling_params.py
//! (`_validate_stop_token_ids`).

use crate::error::ApiError;

/// The prompt's and stop tokens' ids lie in the vocabulary.
pub fn check_vocab(prompt: &[u32], stop_token_ids: &[u32], vocab: usize) -> Result<(), ApiError> {
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::BadRequest(format!(
            "token id {bad} is out of vocabulary (size {vocab})"
        )));
    }
    if let Some(&bad) = stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::BadRequest(format!(
            "token_id(s) [{bad}] in stop_token_ids contain out-of-vocab token ids. Vocabulary size: {vocab}"
        )));
    }
    Ok(())
}

/// The number of tokens to generate: a prompt filling the context, or `max_tokens` over
/// the whole context, is an error; otherwise the request is capped at what the context
/// leaves after the prompt.
pub fn max_tokens(
    prompt_len: usize,
    requested: Option<u32>,
    max_model_len: u32,
) -> Result<u32, ApiError> {
    let plen = u32::try_from(prompt_len).unwrap_or(u32::MAX);
    if plen >= max_model_len {
        return Err(ApiError::BadRequest(format!(
            "This model's maximum context length is {max_model_len} tokens. However, your request has {plen} input tokens. Please reduce the length of the input messages."
        )));
    }
    match requested {
        Some(n) if n > max_model_len => Err(ApiError::BadRequest(format!(
            "max_tokens={n} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens."
        ))),
        Some(n) => Ok(n.min(max_model_len - plen)),
        None => Ok(max_model_len - plen),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_at_the_context() {
        assert_eq!(max_tokens(10, Some(5), 100).ok(), Some(5));
        assert_eq!(max_tokens(10, Some(95), 100).ok(), Some(90));
        assert_eq!(max_tokens(10, None, 100).ok(), Some(90));
        assert!(max_tokens(100, Some(1), 100).is_err());
        assert!(max_tokens(10, Some(101), 100).is_err());
        assert!(check_vocab(&[1, 2], &[99], 50).is_err());
        assert!(check_vocab(&[1, 2], &[3], 50).is_ok());
    }
}
