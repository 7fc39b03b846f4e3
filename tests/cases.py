"""The SexpGPU sources the tests compile: golden/ holds one case per precision rule,
examples/ the bundled models; each NAME.lisp sits beside the NAME.py it compiles to."""

from __future__ import annotations

from pathlib import Path

from sx2torch import format
from sx2torch.compiler import Options, compile_source

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden"
EXAMPLES = ROOT / "examples"
SOURCES = sorted(
    (p for d in (GOLDEN, EXAMPLES) for p in d.glob("*.lisp")), key=lambda p: p.name
)


def emitted(source: str, **options) -> str:
    """The module the compiler hands the format pass."""
    handed = []
    real = format.run
    try:
        format.run = lambda code: handed.append(code) or real(code)
        compile_source(source, "m.lisp", Options(**options))
    finally:
        format.run = real
    return handed[0]


def lisp(name: str) -> Path:
    """The source named NAME.lisp, in golden/ or examples/."""
    (path,) = [p for p in SOURCES if p.stem == name]
    return path


# The ports' tiny configs (transformers' config names), shared by their tests and the
# generation tests
LLAMA = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
GPT2 = dict(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4)
T5 = dict(
    vocab_size=64,
    d_model=16,
    d_kv=4,
    d_ff=24,
    num_layers=2,
    num_decoder_layers=3,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=12,
)
# head_dim 6 in the encoder and 8 in the decoder: neither scaling is a power of 2; 20 mel
# frames (2 * max_source_positions), and room for a 32-token generation
WHISPER = dict(
    vocab_size=64,
    num_mel_bins=8,
    d_model=24,
    encoder_layers=2,
    encoder_attention_heads=4,
    encoder_ffn_dim=40,
    decoder_layers=2,
    decoder_attention_heads=3,
    decoder_ffn_dim=36,
    max_source_positions=10,
    max_target_positions=40,
    pad_token_id=0,  # within the tiny vocabulary: WhisperConfig's 50256 is not
)
BART = dict(
    vocab_size=64,
    max_position_embeddings=48,
    encoder_layers=2,
    encoder_ffn_dim=40,
    encoder_attention_heads=4,
    decoder_layers=3,
    decoder_ffn_dim=32,
    decoder_attention_heads=2,
    d_model=24,
)
GEMMA2 = dict(
    vocab_size=256,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=24,
    sliding_window=6,
    final_logit_softcapping=3.0,
    attn_logit_softcapping=2.0,
)
MIXTRAL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
)
MAMBA = dict(
    vocab_size=256,
    hidden_size=64,
    state_size=8,
    num_hidden_layers=2,
    expand=2,
    conv_kernel=4,
    time_step_rank=8,
)


def f32_and_bf16(f32, folder: Path, **settings) -> tuple:
    """transformers' model `f32` with its random weights moved off their initial values (so
    that every parameter counts), and the same saved to `folder` and loaded back as
    from_pretrained(..., dtype=bf16) loads a checkpoint."""
    import torch

    with torch.no_grad():
        for p in f32.parameters():
            p.add_(0.05 * torch.randn_like(p))
    f32.save_pretrained(folder)
    bf16 = type(f32).from_pretrained(folder, dtype=torch.bfloat16, **settings)
    return f32.eval(), bf16.eval()


def whisper_f32_and_bf16(folder: Path) -> tuple:
    """transformers' WhisperForConditionalGeneration at WHISPER's sizes with random weights
    (the norms' weights around 1 and biases around 0, of std 0.3; the rest of std 1: a
    greedy decoding of smaller ones repeats one token), eager attention, and the same as
    from_pretrained(..., dtype=bf16) loads it from `folder`. No token is suppressed or
    forced: its generation config leaves greedy decoding plain."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    eager = dict(attn_implementation="eager")
    config = WhisperConfig(
        **WHISPER,
        **eager,
        bos_token_id=1,
        decoder_start_token_id=1,
        eos_token_id=None,
        begin_suppress_tokens=None,
    )
    f32 = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, value in f32.named_parameters():
            norm = "norm" in name
            value.normal_(
                1.0 if name.endswith("norm.weight") else 0.0, 0.3 if norm else 1.0
            )
    f32.save_pretrained(folder)
    bf16 = WhisperForConditionalGeneration.from_pretrained(
        folder, dtype=torch.bfloat16, **eager
    )
    return f32, bf16.eval()


# The runs that compile a port for sx2torch.runtime.generate, added to its source by the
# generation tests (Llama's source keeps within its 72 lines)
GENERATE_RUNS = (
    "\n(defrun generate :precision :bf16 :generate true)"
    "\n(defrun generate-exact :precision :f32 :generate true)\n"
)

# The Llama port's consts at the tests' sizes (LLAMA's), as (what the source says, what a
# test writes instead): a module built with its defaults is then the tiny one
TINY_LLAMA = [
    ("(defconst vocab-size 32000)", "(defconst vocab-size 256)"),
    ("(defconst hidden-size 4096)", "(defconst hidden-size 64)"),
    ("(defconst intermediate-size 11008)", "(defconst intermediate-size 128)"),
    ("(defconst num-hidden-layers 32)", "(defconst num-hidden-layers 2)"),
    ("(defconst num-attention-heads 32)", "(defconst num-attention-heads 4)"),
    ("(defconst num-key-value-heads 32)", "(defconst num-key-value-heads 2)"),
]
