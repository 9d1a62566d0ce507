//! Tokens per round of greedy speculation for draft models with the target's vocabulary
//! and with another one, against a target model run here (greedy verify is exact: a
//! round accepts the longest prefix of the proposal that is the target's own greedy
//! continuation, plus one target token).
//!
//! Also reports the translation's overhead per round, read from specd's own histogram.

use std::path::PathBuf;
use std::sync::Arc;

use specd::draft::model::{DraftDevice, DrafterOptions, ModelDrafter, VocabMode};
use specd::draft::{DraftRequest, Drafter};
use specd::metrics::Metrics;
use specd::tokens::ModelTokenizer;

#[derive(Debug, Clone, clap::Args)]
pub struct XvocabArgs {
    /// Target model directory (its tokenizer is the target vocabulary).
    #[arg(long)]
    pub target: PathBuf,
    /// Draft model directories, comma separated; the first is the baseline of the ratio.
    #[arg(long, value_delimiter = ',')]
    pub drafts: Vec<PathBuf>,
    /// Text files to continue (one prompt per file, from its start).
    #[arg(long, value_delimiter = ',')]
    pub prompts: Vec<PathBuf>,
    /// Draft length per round.
    #[arg(long, default_value_t = 4)]
    pub k: usize,
    /// Prompt tokens taken from each file.
    #[arg(long, default_value_t = 192)]
    pub prompt_tokens: usize,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 128)]
    pub tokens: usize,
    /// Also render each prompt as a chat turn (the target's chat template).
    #[arg(long)]
    pub chat: bool,
    /// Add a row for the first draft drafting through text although its vocabulary is
    /// the target's: what the translation itself costs.
    #[arg(long)]
    pub force_translation: bool,
    /// Device the drafts run on (cpu, cuda, cuda:N); the target runs on the CPU.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The drafts' dtype (default: the device's, bf16 on CUDA).
    #[arg(long)]
    pub dtype: Option<String>,
}

struct Row {
    draft: String,
    mode: VocabMode,
    rounds: u64,
    emitted: u64,
    micros_per_round: f64,
    /// Wall time of `propose` per drafted token, translation included.
    draft_ms_per_token: f64,
}

pub async fn run(a: XvocabArgs) -> anyhow::Result<()> {
    let tok = Arc::new(ModelTokenizer::load(&a.target)?);
    let target = ModelDrafter::load(&a.target, "cpu", None)?;
    let mut prompts = Vec::new();
    for p in &a.prompts {
        let text = std::fs::read_to_string(p)?;
        let ids = tok
            .tokenizer
            .encode(text.as_str(), true)
            .map_err(anyhow::Error::msg)?;
        let ids = ids.get_ids();
        prompts.push(ids[..ids.len().min(a.prompt_tokens)].to_vec());
        if a.chat {
            let chat = format!(
                "<|begin_of_text|><|im_start|>user\nContinue this file:\n{}<|im_end|>\n<|im_start|>assistant\n",
                text.chars().take(400).collect::<String>()
            );
            let ids = tok
                .tokenizer
                .encode(chat.as_str(), false)
                .map_err(anyhow::Error::msg)?;
            prompts.push(ids.get_ids().to_vec());
        }
    }
    // The target's greedy continuations: what a greedy verify accepts.
    let mut truths = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let req = DraftRequest {
            stream: i as u64,
            context: p.clone().into(),
            prompt_len: p.len(),
            max_k: a.tokens,
        };
        truths.push(target.propose(req).await?.tokens);
    }
    let mut rows = Vec::new();
    let mut runs: Vec<(PathBuf, bool)> = a.drafts.iter().map(|d| (d.clone(), false)).collect();
    if let (true, Some(first)) = (a.force_translation, a.drafts.first()) {
        runs.insert(1, (first.clone(), true));
    }
    for (dir, force) in &runs {
        let metrics = Metrics::new();
        let opts = DrafterOptions {
            force_translation: *force,
            ..DrafterOptions::default()
        };
        let device: DraftDevice = a.device.parse()?;
        let dtype = a.dtype.as_deref().map(str::parse).transpose()?;
        let d = ModelDrafter::load_with(dir, device, dtype, opts)?;
        let mode = d.bind_target(&tok, Some(&metrics))?;
        let (mut rounds, mut emitted, mut drafted) = (0u64, 0u64, 0u64);
        let mut drafting = std::time::Duration::ZERO;
        for (i, (p, truth)) in prompts.iter().zip(&truths).enumerate() {
            let mut pos = 0;
            while pos < truth.len() {
                let mut ctx = p.clone();
                ctx.extend_from_slice(&truth[..pos]);
                let k = a.k.min(truth.len() - pos);
                let req = DraftRequest {
                    stream: 1000 + i as u64,
                    context: ctx.into(),
                    prompt_len: p.len(),
                    max_k: k,
                };
                let t = std::time::Instant::now();
                let prop = d.propose(req).await?;
                drafting += t.elapsed();
                drafted += prop.tokens.len() as u64;
                let acc = prop
                    .tokens
                    .iter()
                    .zip(&truth[pos..])
                    .take_while(|(x, y)| x == y)
                    .count();
                let n = (acc + 1).min(truth.len() - pos);
                pos += n;
                emitted += n as u64;
                rounds += 1;
            }
        }
        let h = &metrics.draft_translation;
        let sum: f64 = ["context", "proposal"]
            .iter()
            .map(|s| h.with_label_values(&[s]).get_sample_sum())
            .sum();
        rows.push(Row {
            draft: dir
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
                + if *force { " (forced through text)" } else { "" },
            mode,
            rounds,
            emitted,
            micros_per_round: 1e6 * sum / rounds.max(1) as f64,
            draft_ms_per_token: 1e3 * drafting.as_secs_f64() / drafted.max(1) as f64,
        });
    }
    println!(
        "\ngreedy speculation at K={} over {} prompts ({} tokens each)\n",
        a.k,
        prompts.len(),
        a.tokens
    );
    println!(
        "| draft | vocabulary | rounds | tokens/round | vs first | translation µs/round | draft ms/token ({}) |",
        a.device
    );
    println!("|---|---|---|---|---|---|---|");
    let base = rows
        .first()
        .map(|r| r.emitted as f64 / r.rounds.max(1) as f64)
        .unwrap_or(1.0);
    for r in &rows {
        let tpr = r.emitted as f64 / r.rounds.max(1) as f64;
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.1} | {:.3} |",
            r.draft,
            match r.mode {
                VocabMode::Same => "same (ids)",
                VocabMode::Translated => "other (text)",
            },
            r.rounds,
            tpr,
            tpr / base,
            r.micros_per_round,
            r.draft_ms_per_token
        );
    }
    Ok(())
}
