//! Where the served model's tokenizer is on this machine. The upstream reports its model
//! as `root` in `/v1/models`: a directory when it serves a local path, or a hub id
//! (`ORG/NAME`) when started as `vllm serve ORG/NAME`. A hub id is resolved the way the
//! Hugging Face hub library lays out its cache, so a sidecar that shares the server's
//! cache volume finds the same files:
//! `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, then
//! `models--ORG--NAME/snapshots/<revision>/`, with `<revision>` from `refs/main`.

use std::path::{Path, PathBuf};

/// The Hugging Face hub cache directory, from the same variables the hub library reads.
pub fn hf_hub_cache() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("HF_HUB_CACHE").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("HF_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("hub"));
    }
    let home = std::env::var_os("HOME").filter(|d| !d.is_empty())?;
    Some(PathBuf::from(home).join(".cache/huggingface/hub"))
}

/// A model directory for what the upstream reports as its model: the directory itself,
/// or the cached snapshot of a hub id. `None` when neither is on this machine.
pub fn model_dir(root: &str) -> Option<PathBuf> {
    let p = Path::new(root);
    if p.is_dir() {
        return Some(p.to_path_buf());
    }
    snapshot(&hf_hub_cache()?, root)
}

/// The snapshot of hub id `ORG/NAME` (or `NAME`) in `cache`: the one `refs/main` names,
/// else the most recently modified snapshot that holds tokenizer files.
pub fn snapshot(cache: &Path, hub_id: &str) -> Option<PathBuf> {
    if hub_id.is_empty() || hub_id.starts_with('/') || hub_id.split('/').count() > 2 {
        return None;
    }
    let repo = cache.join(format!("models--{}", hub_id.replace('/', "--")));
    let snapshots = repo.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo.join("refs/main")) {
        let dir = snapshots.join(rev.trim());
        if has_tokenizer(&dir) {
            return Some(dir);
        }
    }
    std::fs::read_dir(&snapshots)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|d| has_tokenizer(d))
        .max_by_key(|d| d.metadata().and_then(|m| m.modified()).ok())
}

/// Tokenizer files specd can load: `tokenizer.json`, or the tiktoken format's ranks.
pub fn has_tokenizer(dir: &Path) -> bool {
    dir.join("tokenizer.json").is_file() || super::tiktoken::is_tiktoken_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_with(hub_id: &str, revs: &[&str], main: Option<&str>) -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "specd-hf-{}-{}",
            std::process::id(),
            hub_id.replace('/', "_")
        ));
        let _ = std::fs::remove_dir_all(&root);
        let repo = root.join(format!("models--{}", hub_id.replace('/', "--")));
        for r in revs {
            let d = repo.join("snapshots").join(r);
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("tokenizer.json"), "{}").expect("write");
        }
        if let Some(m) = main {
            std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
            std::fs::write(repo.join("refs/main"), format!("{m}\n")).expect("write");
        }
        root
    }

    #[test]
    fn a_hub_id_resolves_to_the_snapshot_refs_main_names() {
        let cache = cache_with("Org/Model", &["aaa", "bbb"], Some("bbb"));
        let got = snapshot(&cache, "Org/Model").expect("resolved");
        assert!(got.ends_with("models--Org--Model/snapshots/bbb"), "{got:?}");
        let _ = std::fs::remove_dir_all(cache);
    }

    #[test]
    fn without_refs_any_snapshot_with_a_tokenizer_is_used() {
        let cache = cache_with("Org/Other", &["ccc"], None);
        let got = snapshot(&cache, "Org/Other").expect("resolved");
        assert!(got.ends_with("snapshots/ccc"), "{got:?}");
        assert_eq!(snapshot(&cache, "Org/Missing"), None);
        assert_eq!(snapshot(&cache, "/abs/path"), None);
        assert_eq!(snapshot(&cache, "a/b/c"), None);
        let _ = std::fs::remove_dir_all(cache);
    }
}
