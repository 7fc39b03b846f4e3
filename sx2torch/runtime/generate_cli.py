"""The `generate` command of a generated file's script: tokens from a trained checkpoint.

    python model.py generate --checkpoint DIR --prompt-ids 1,2,3 [--max-new-tokens N]
        [--temperature T] [--top-k K] [--top-p P] [--seed S] [--eos-token-id ID]
        [--decoder-start-token-id ID]

`--checkpoint` is a run's folder (its newest checkpoint that verifies, as `--resume` takes
it), one checkpoint (`DIR/checkpoints/step-N`) or the final weights (`DIR/model.pt`). The
tokens, prompt included, are printed as one line of comma-separated ids; a generation that
lasts more than a second shows a progress bar on stderr. Decoding is greedy unless one of
`--temperature`, `--top-k`, `--top-p` is given. The decoding itself is
`sx2torch.runtime.generate.generate`: the file must be compiled from a run with
`:generate true`, whose module keeps a KV cache. An encoder-decoder's (`:generate NAME`)
takes `--decoder-start-token-id`: the prompt is then the encoder's, and the tokens printed
the decoder's, that token first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from sx2torch.runtime import checkpoint
from sx2torch.runtime.data import DataError
from sx2torch.runtime.sampling import check_settings

__all__ = ["arguments", "run"]

PROGRESS_AFTER_S = 1.0  # a shorter generation shows no bar


def arguments(argv) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error("--max-new-tokens N needs N >= 1")
    try:
        check_settings(_temperature(args), args.top_k, args.top_p)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    return args


def _temperature(args: argparse.Namespace) -> float:
    return 1.0 if args.temperature is None else args.temperature


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{Path(sys.argv[0]).name} generate",
        description="Generate tokens from a trained checkpoint, with the KV cache of a "
        "file compiled from a run with :generate true.",
        epilog="Prints the tokens, the prompt included, as one line of comma-separated "
        "ids. Errors are one line: exit 2, or 1 for an internal one.",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="PATH",
        help="a run's folder (its newest checkpoint that verifies), one checkpoint "
        "(DIR/checkpoints/step-N) or the final weights (DIR/model.pt)",
    )
    parser.add_argument(
        "--prompt-ids",
        required=True,
        type=_token_ids,
        metavar="IDS",
        help="the prompt's token ids, comma-separated: 1,2,3",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=32, metavar="N", help="default: 32"
    )
    sampling = parser.add_argument_group(
        "sampling", "greedy unless one of these is given; transformers' processors"
    )
    sampling.add_argument("--temperature", type=float, help="divides the logits")
    sampling.add_argument("--top-k", type=int, help="keep the K most likely tokens")
    sampling.add_argument(
        "--top-p", type=float, help="keep the most likely tokens holding P of the mass"
    )
    sampling.add_argument(
        "--seed", type=int, default=0, help="the draws' generator's seed (default: 0)"
    )
    parser.add_argument(
        "--eos-token-id", type=int, metavar="ID", help="stop when this token is made"
    )
    parser.add_argument(
        "--decoder-start-token-id",
        type=int,
        metavar="ID",
        help="an encoder-decoder's: the decoder's first token (the prompt is the encoder's)",
    )
    parser.add_argument(
        "--traceback", action="store_true", help="show the traceback of an error"
    )
    return parser


def _token_ids(text: str) -> list:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: comma-separated token ids, such as 1,2,3"
        ) from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"{text!r}: token ids are >= 0")
    return ids


def run(model_class: type, args: argparse.Namespace, encoder_decoder: bool) -> int:
    """Load the checkpoint into a new `model_class()`, generate and print the tokens."""
    start = args.decoder_start_token_id
    if encoder_decoder != (start is not None):
        raise DataError(
            "--decoder-start-token-id: an encoder-decoder's decoder starts from it, "
            + ("give it" if encoder_decoder else "and this model is not one")
        )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model_class()
    load(model, Path(args.checkpoint))
    # deferred: the driver brings the cache, which only this command needs
    from sx2torch.runtime.generate import generate

    model.to(device).eval()
    prompt = torch.tensor([args.prompt_ids], dtype=torch.long, device=device)
    sample = any(v is not None for v in (args.temperature, args.top_k, args.top_p))
    progress = _Progress(args.max_new_tokens)
    try:
        tokens = generate(
            model,
            prompt,
            args.max_new_tokens,
            do_sample=sample,
            temperature=_temperature(args),
            top_k=args.top_k,
            top_p=args.top_p,
            generator=torch.Generator(device).manual_seed(args.seed),
            eos_token_id=args.eos_token_id,
            streamer=progress,
            decoder_start_token_id=start,
        )
    except IndexError as error:  # an id past the embedding's rows
        raise DataError(f"--prompt-ids: {error}") from None
    finally:
        progress.close()
    print(",".join(str(t) for t in tokens[0].tolist()))
    return 0


def load(model: torch.nn.Module, path: Path) -> None:
    """The weights of a run's folder, a checkpoint folder or a `model.pt` into `model`."""
    if path.is_file():
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            model.load_state_dict(state, strict=True)
        except Exception as error:  # not a state_dict, or another model's
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise checkpoint.CheckpointError(
                f"--checkpoint {path}: not {type(model).__name__}'s weights "
                f"({type(error).__name__}: {first})"
            ) from None
    elif path.is_dir():
        checkpoint.load_checkpoint(model, path, asked="--checkpoint", warn=_warn)
    else:
        raise DataError(f"--checkpoint {path}: no such file or folder")


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)


class _Progress:
    """transformers' streamer protocol (`put` the prompt, then each new token; `end`) as a
    progress bar, shown once the generation has lasted PROGRESS_AFTER_S."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="tok", delay=PROGRESS_AFTER_S, leave=False)
        self.prompt_seen = False

    def put(self, tokens: torch.Tensor) -> None:
        if self.prompt_seen:
            self.bar.update(1)
        self.prompt_seen = True

    def end(self) -> None:
        self.close()

    def close(self) -> None:
        self.bar.close()
