"""The policy: a tokenizer, a causal LM, float32 log-probabilities and the warm start.

The policy is any Hugging Face causal LM: either one from a local directory
(``AutoModelForCausalLM`` and ``AutoTokenizer``, nothing downloaded) or the built-in tiny
model, a Llama- or GPT-2-style config created in code with a character-level tokenizer
(itself a ``PreTrainedTokenizerFast``, so that ``save_pretrained`` writes a directory that
loads back through the same door).

:func:`token_logprobs` is the one place where logits become numbers the loss sees: it runs
the transformer body once, then applies the output head to ``chunk`` tokens at a time, in
float32, under activation checkpointing when gradients are on.  A 150k vocabulary over
thousands of tokens therefore never holds more than ``chunk x vocab`` float32 logits.
"""

from __future__ import annotations

import inspect
import io
from pathlib import Path

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from fbands import _cache, _checks
from fbands.errors import ConfigError
from fbands.rl.pretrained import default_cache_dir

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


# --- tokenizer -----------------------------------------------------------------------------
def char_tokenizer(alphabet: str):
    """A character-level ``PreTrainedTokenizerFast`` over ``alphabet`` plus pad, eos, unk.

    Example
    -------
    >>> tok = char_tokenizer("ab>")
    >>> ids = tok("ba>", add_special_tokens=False)["input_ids"]
    >>> len(ids), tok.decode(ids)
    (3, 'ba>')
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *sorted(set(alphabet))])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS,
                                   unk_token=UNK, clean_up_tokenization_spaces=False)


class Codec:
    """The few tokenizer operations the trainer needs, on top of any HF tokenizer.

    With ``chat=True`` a prompt is the tokenizer's chat template applied to one user turn
    (after a system turn when ``system_prompt`` is set; an empty one leaves the template's
    own default) with the assistant header appended, and an answer ends with the
    end-of-turn token (the tokenizer's eos).  Sampling also stops at any of ``stop_ids``.
    """

    def __init__(self, tokenizer, *, chat: bool = False, system_prompt: str = "",
                 stop_ids=()):
        self.tokenizer = tokenizer
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos token")
        self.eos_id = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.pad_id = self.eos_id if pad is None else int(pad)
        self.chat = chat
        self.system_prompt = system_prompt
        self.stop_ids = sorted({self.eos_id, *(int(i) for i in stop_ids)})

    def prompt_text(self, text: str) -> str:
        """The text the model reads for a prompt (the chat template applied, if any)."""
        if not self.chat:
            return text
        turns = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        turns.append({"role": "user", "content": text})
        return self.tokenizer.apply_chat_template(turns, tokenize=False,
                                                  add_generation_prompt=True)

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of a prompt (with the model's BOS if its tokenizer adds one)."""
        if self.chat:  # the template writes every special token itself
            return list(self.tokenizer(self.prompt_text(text),
                                       add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(text)["input_ids"])

    def answer_ids(self, text: str) -> list[int]:
        """Token ids of an answer, followed by the end token."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.eos_id]

    def cut(self, ids: list[int]) -> list[int]:
        """``ids`` up to (not including) the first stop token."""
        for i, token in enumerate(ids):
            if token in self.stop_ids:
                return ids[:i]
        return ids

    def decode_answer(self, ids: list[int]) -> str:
        """Text of a sampled answer, up to (not including) the first end token."""
        return self.tokenizer.decode(self.cut(ids), skip_special_tokens=True)


def pad_batch(prompts: list[list[int]], answers: list[list[int]] | None, pad_id: int,
              device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-pad prompts and right-pad answers into one ``(B, P + A)`` batch.

    Returns ``(input_ids, attention_mask, P)``: every answer starts at column ``P``.
    """
    width_p = max(len(p) for p in prompts)
    width_a = max((len(a) for a in answers), default=0) if answers else 0
    ids = np.full((len(prompts), width_p + width_a), pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width_p - len(p): width_p] = p
        mask[i, width_p - len(p): width_p] = 1
        if answers:
            a = answers[i]
            ids[i, width_p: width_p + len(a)] = a
            mask[i, width_p: width_p + len(a)] = 1
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device), width_p


# --- model ---------------------------------------------------------------------------------
def build_tiny_model(cfg, tokenizer):
    """The built-in tiny causal LM (``cfg.tiny_arch``: llama or gpt2), seeded, no dropout."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    d, layers, heads = cfg.tiny_d_model, cfg.tiny_layers, cfg.tiny_heads
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
               eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    if cfg.tiny_arch == "llama":
        config = LlamaConfig(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=heads,
                             max_position_embeddings=256, tie_word_embeddings=True, **ids)
    else:
        config = GPT2Config(n_embd=d, n_layer=layers, n_head=heads, n_positions=256,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids)
    torch.manual_seed(cfg.warm_start_seed)
    return AutoModelForCausalLM.from_config(config)


def load_policy(cfg, task, log=print):
    """``(model, codec)``: the built-in tiny model or a pretrained one (see
    :mod:`fbands.rl.pretrained`), float32, with LoRA adapters when ``cfg.lora_rank > 0``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fbands.rl.pretrained import resolve_model

    if cfg.model == "tiny":
        tokenizer = char_tokenizer(task.alphabet)
        model = build_tiny_model(cfg, tokenizer)
        codec = Codec(tokenizer)
    else:
        folder = resolve_model(cfg.model, cfg.cache_dir, log)
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            reason = _checks.reason(err)
            raise ConfigError(f"model={cfg.model!r}: {str(folder)!r} does not load as a "
                              f"Hugging Face causal language model ({reason})") from err
        stop = model.generation_config.eos_token_id
        stop = [] if stop is None else [stop] if isinstance(stop, int) else list(stop)
        chat = cfg.chat_template and bool(getattr(tokenizer, "chat_template", None))
        codec = Codec(tokenizer, chat=chat, system_prompt=cfg.system_prompt, stop_ids=stop)
    model.config.use_cache = True
    if cfg.lora_rank:
        add_lora(model, cfg.lora_rank, cfg.lora_alpha, seed=cfg.warm_start_seed)
    return model, codec


def max_positions(model) -> int | None:
    """The longest sequence ``model``'s position embeddings cover (None: not stated)."""
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(model.config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


#: the linear layers LoRA adapts (Llama names; a model without them fails with peft's error)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def add_lora(model, rank: int, alpha: float, seed: int = 0):
    """Insert LoRA adapters (``peft``) into ``model``'s linear layers, in place.

    Only the adapters stay trainable.  ``model`` keeps its class, so the trainer's
    ``base_model`` / output-head access and ``state_dict`` (base weights + adapters) work
    unchanged.  The adapters' random init draws from ``seed``.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ConfigError("lora_rank > 0 needs peft (the 'llm' extra)") from err
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none",
                        target_modules=list(LORA_TARGETS))
    get_peft_model(model, config)  # wraps, and injects into `model` itself
    return model


def body_forward(model, input_ids, attention_mask, position_ids, cache=None):
    """Run the transformer body (no output head) with a KV cache; ``(hidden, cache)``.

    transformers 5 names the cache argument ``cache``, earlier versions ``past_key_values``.
    """
    body = model.base_model
    params = inspect.signature(body.forward).parameters
    name = "cache" if "cache" in params else "past_key_values"
    out = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
               use_cache=True, **{name: cache})
    new_cache = out.cache if hasattr(out, "cache") else out.past_key_values
    return out.last_hidden_state, new_cache


# --- log-probabilities -------------------------------------------------------------------
def _head_logprobs(head, hidden, targets, temperature: float):
    """float32 log-probabilities of ``targets`` and entropies, for ``(N, D)`` hidden states.

    The head runs in float32 even under bf16 autocast: ratios near 1 must not carry bf16
    rounding of the logits.
    """
    with torch.autocast(hidden.device.type, enabled=False):
        logits = head(hidden.float()) / temperature  # (N, V) float32
    log_z = torch.logsumexp(logits, dim=-1)  # (N,)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z  # (N,)
    entropy = log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # (N,)
    return logp, entropy


def token_logprobs(model, input_ids, attention_mask, start: int, *, temperature: float = 1.0,
                   chunk: int = 256):
    r"""Log-probabilities and entropies of the tokens ``input_ids[:, start:]``.

    .. math::
        \log \pi(x_t \mid x_{<t}) = z_{x_t} / T - \log \textstyle\sum_v e^{z_v / T},
        \qquad H_t = -\textstyle\sum_v \pi_v \log \pi_v

    computed in float32 from the logits ``z`` at position ``t - 1``, ``chunk`` tokens at a
    time (recomputed in the backward pass rather than stored).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM (its ``base_model`` and output embeddings are used).
    input_ids, attention_mask : torch.Tensor
        ``(B, L)``; prompts left-padded.
    start : int
        First column whose token is scored (``start >= 1``).
    temperature : float
        The sampling temperature the log-probabilities refer to.
    chunk : int
        Tokens per float32 head evaluation.

    Returns
    -------
    logp, entropy : torch.Tensor
        ``(B, L - start)``, float32.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
    body = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, use_cache=False)
    hidden = body.last_hidden_state[:, start - 1: -1]  # (B, L - start, D) predicts the targets
    shape = hidden.shape[:2]
    hidden = hidden.reshape(-1, hidden.shape[-1])  # (N, D)
    targets = input_ids[:, start:].reshape(-1)  # (N,)
    head = model.get_output_embeddings()
    logps, entropies = [], []
    for s in range(0, targets.numel(), chunk):
        args = (head, hidden[s: s + chunk], targets[s: s + chunk], temperature)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_head_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _head_logprobs(*args)
        logps.append(lp)
        entropies.append(ent)
    return torch.cat(logps).view(shape), torch.cat(entropies).view(shape)


# --- supervised warm start -----------------------------------------------------------------
#: the largest warm-start file read back (the built-in models' weights are a few MiB)
WARM_START_MAX_BYTES = 1 << 31

def warm_start(model, codec: Codec, task, cfg, device, log=print) -> str:
    """Supervised warm start on ``task``'s examples, cached on disk by config hash.

    Trains ``cfg.warm_start_steps`` AdamW steps of answer-token cross-entropy on batches of
    ``cfg.warm_start_batch`` examples, then saves the weights to
    ``<cache>/warmstart/<task>-<key>.pt``; a later call with the same key loads them instead.
    The weights choose every run's start, so they are kept only in a folder private to this
    user (:func:`fbands._cache.private_dir`), read only from a regular file of this user's,
    and never when that folder is not safe (another user could write it): then the warm
    start is trained afresh, and not saved.  Returns a short description of what happened.
    """
    if cfg.warm_start_steps == 0:
        return "warm start: skipped (warm_start_steps=0)"
    cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    folder = _cache.private_dir("warmstart", cache)
    if folder is None:
        log(f"warm start: {cache / 'warmstart'} is not a folder private to this user (another "
            "user could choose the weights there); training without the cache")
    path = folder / f"{cfg.task}-{cfg.warm_start_key()}.pt" if folder else None
    raw = _cache.read_file(path, WARM_START_MAX_BYTES) if path else None
    if raw is not None:
        try:
            model.load_state_dict(torch.load(io.BytesIO(raw), map_location=device,
                                             weights_only=True))
            return f"warm start: loaded {path}"
        except Exception as err:  # noqa: BLE001 - any damage (truncated, foreign, wrong shape)
            log(f"warm start: ignoring the unreadable cache file {path} "
                f"({type(err).__name__}); training again")

    rng = np.random.default_rng([cfg.warm_start_seed, 7])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.warm_start_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / 20) * max(0.05, 1 - i / cfg.warm_start_steps))
    model.train()
    for i in range(cfg.warm_start_steps):
        examples = task.sft_examples(rng, cfg.warm_start_batch)
        ids, mask, width_p = pad_batch([codec.prompt_ids(p) for p, _ in examples],
                                       [codec.answer_ids(a) for _, a in examples],
                                       codec.pad_id, device)
        logp, _ = token_logprobs(model, ids, mask, width_p, chunk=cfg.logprob_chunk)
        answer_mask = mask[:, width_p:].float()
        loss = -(logp * answer_mask).sum() / answer_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (i + 1) % max(1, cfg.warm_start_steps // 4) == 0:
            log(f"warm start {i + 1}/{cfg.warm_start_steps}: answer NLL {loss.item():.3f}")
    done = f"warm start: trained {cfg.warm_start_steps} steps"
    if path is None:
        return done
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    if not _cache.write_file(path, buf.getvalue()):  # (atomic: never half a file)
        return f"{done} (could not save {path})"
    return f"{done}, saved {path}"
