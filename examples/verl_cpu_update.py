"""One actor update of verl's own worker code on a CPU, with the band as its policy loss.

verl's trainer needs GPUs, but the part of its loop that trains the policy runs on a CPU:
this script builds verl's ``ActorRolloutRefWorker`` (the FSDP2 engine, torch.distributed over
gloo) on a tiny random Qwen2 model, lets it compute the old log-probabilities of a small
rollout batch, and runs ``update_actor`` on that batch as verl's ``RayPPOTrainer`` prepares
it, with the band loss (``loss_mode=band``, KL, radius 0.05) registered by fbands' plug-in.
It checks that verl called the band, that every weight moved and that the band's metrics came
back, in about ten seconds (twenty with Ray)::

    python examples/verl_cpu_update.py                        # the worker, in this process
    python examples/verl_cpu_update.py --ray --world 2        # verl's Ray worker group, 2 ranks
    python examples/verl_cpu_update.py +actor_rollout_ref.actor.policy_loss.delta=0.1

Further arguments are Hydra overrides of verl's ``ppo_trainer`` configuration, as you would
give ``verl.trainer.main_ppo`` (``KEY=`` drops one of the script's own).  What still needs
GPUs: rollout (vLLM or SGLang), and verl's trainer itself, whose resource pools ask Ray for
GPUs.  verl 0.9.1 has no CPU platform, so the script installs one (:func:`use_cpu`, three
stand-ins, each saying why); nothing of fbands is changed.

Needs ``pip install ".[verl]"`` (a checkout of fbands).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import verl.plugin.platform.platform_manager as platforms
from verl.plugin.platform import PlatformBase, PlatformRegistry, set_platform

# ----------------------------------------------------------------------------- a CPU for verl


class _CPUDevice(types.ModuleType):
    """What verl's ``get_torch_device()`` returns on this platform: ``torch.cpu``, and
    stand-ins for the memory and seed calls verl makes on ``torch.cuda``."""

    def __init__(self):
        super().__init__("verl_cpu_device")

    def __getattr__(self, name):
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated",
                    "memory_reserved"):
            return lambda *a, **k: 0
        if name == "mem_get_info":
            return lambda *a, **k: (0, 0)
        if name == "get_device_name":  # (verl's flops counter asks)
            return lambda *a, **k: "CPU"
        if name in ("manual_seed", "manual_seed_all", "empty_cache", "reset_peak_memory_stats",
                    "set_device", "ipc_collect"):
            return lambda *a, **k: None
        raise AttributeError(f"the CPU stand-in of torch.cuda has no {name!r}")


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's platform interface on a CPU: gloo, one device, no memory to report."""

    _device = _CPUDevice()
    device_name = property(lambda self: "cpu")
    vendor_name = property(lambda self: "cpu")
    device_module = property(lambda self: self._device)

    def is_available(self): return True
    def current_device(self): return torch.device("cpu")
    def device_count(self): return 1
    def set_device(self, device_index): pass
    def synchronize(self, device_index=None): pass
    def manual_seed(self, seed): torch.manual_seed(seed)
    def manual_seed_all(self, seed): torch.manual_seed(seed)
    def set_allocator_settings(self, settings): pass
    def empty_cache(self): pass
    def get_device_capability(self, device_index=0): return None, None
    def communication_backend_name(self): return "gloo"
    def visible_devices_envvar(self): return "CUDA_VISIBLE_DEVICES"
    def profiler_start(self): pass
    def profiler_stop(self): pass
    def ray_resource_name(self): return "CPU"
    def ray_resource_options(self, num_gpus): return {"num_cpus": 1}
    def ray_noset_envvars(self): return []
    def is_ipc_supported(self): return False
    def cudart(self): return None

    @contextlib.contextmanager
    def nvtx_range(self, msg):
        yield


def use_cpu() -> None:
    """Make verl 0.9.1 run its worker on a CPU (before anything asks for its platform)."""
    current = platforms._current_platform
    if current is not None and current.device_name == "cpu":
        return
    # 1. Without an accelerator verl picks its CUDA platform (NCCL, torch.cuda calls).
    os.environ["VERL_PLATFORM"] = "cpu"
    set_platform(PlatformCPU())
    # The FSDP engines are registered for CUDA and NPU; this variable picks theirs.
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    # 2. The worker asks torch for "cpu:gloo,cpu:gloo" ("duplicate device type").
    import verl.utils.distributed as distributed
    import verl.workers.engine_workers as engine_workers

    engine_workers.initialize_global_process_group_ray = functools.partial(
        distributed.initialize_global_process_group_ray, backend="gloo")
    # 3. verl patches TRL's value-head model whenever TRL is installed, importing a class that
    #    TRL 1.16 no longer has (on a GPU too): the actor needs no value head.
    import verl.models.transformers.monkey_patch as monkey_patch

    monkey_patch.is_trl_available = lambda: False


use_cpu()  # (at import: Ray's worker processes import this module to build the worker)

import verl  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.utils.metric.utils import reduce_metrics  # noqa: E402
from verl.workers.engine_workers import ActorRolloutRefWorker  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding  # noqa: E402

import fbands.integrations.verl as fv  # noqa: E402

fv.register()

# ----------------------------------------------------------------------------- model, batch

SEQUENCES = 4  # one mini-batch of two micro-batches
VOCAB = 128
#: The script's overrides of verl's configuration; the last four are the verl guide's band.
OVERRIDES = (
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # (no flash-attn)
    "actor_rollout_ref.model.use_remove_padding=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=False",
    "actor_rollout_ref.actor.strategy=fsdp2",  # (FSDP1 wants its parameters on a GPU)
    "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "actor_rollout_ref.actor.use_torch_compile=False",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={SEQUENCES}",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.optim.lr=1e-2",
    "actor_rollout_ref.actor.optim.total_training_steps=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.policy_loss._target_=fbands.integrations.verl.BandPolicyLossConfig",
    "actor_rollout_ref.actor.policy_loss.loss_mode=band",
    "+actor_rollout_ref.actor.policy_loss.div=kl",
    "+actor_rollout_ref.actor.policy_loss.delta=0.05",
)


def tiny_model(folder: Path) -> str:
    """A random two-layer Qwen2 and a word-level tokenizer, saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                            eos_token="</s>", unk_token="w0").save_pretrained(folder)
    return str(folder)


def compose(model: str, extra: list[str]):
    """verl's ``ppo_trainer`` configuration with the script's overrides, then ``extra``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    def key(o):
        return o.lstrip("+~").split("=", 1)[0]

    given = {key(o) for o in extra}
    overrides = [f"actor_rollout_ref.model.path={model}"]
    overrides += [o for o in OVERRIDES if key(o) not in given]
    overrides += [o for o in extra if not o.endswith("=")]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"),
                               version_base=None):
        return hydra_compose("ppo_trainer", overrides=overrides)


def rollout() -> DataProto:
    """Left-padded prompts, right-padded responses and one advantage per sequence."""
    g = torch.Generator().manual_seed(0)
    n, p_len, r_len = SEQUENCES, 6, 10
    prompts = torch.zeros(n, p_len, dtype=torch.long)
    responses = torch.zeros(n, r_len, dtype=torch.long)
    p_mask, r_mask = torch.zeros_like(prompts), torch.zeros_like(responses)
    for i, (a, b) in enumerate(zip([6, 4, 5, 3], [10, 7, 9, 5], strict=True)):
        prompts[i, p_len - a:] = torch.randint(3, VOCAB, (a,), generator=g)
        p_mask[i, p_len - a:] = 1
        responses[i, :b] = torch.randint(3, VOCAB, (b,), generator=g)
        r_mask[i, :b] = 1
    attention = torch.cat([p_mask, r_mask], 1)
    advantages = torch.randn(n, 1, generator=g).expand(n, r_len) * r_mask
    return DataProto.from_dict(
        tensors={"input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention,
                 "position_ids": (attention.cumsum(1) - 1).clamp(min=0), "prompts": prompts,
                 "responses": responses, "response_mask": r_mask,
                 "advantages": advantages.contiguous()},
        meta_info={"temperature": 1.0})


def log_prob_request(batch: DataProto):
    """The request of ``compute_log_prob``, as ``RayPPOTrainer._compute_old_log_prob`` makes
    it."""
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=True, calculate_sum_pi_squared=False,
                         compute_loss=False)
    return td


def stale(batch: DataProto, request, log_probs, noise: float = 1.0) -> None:
    """Old log-probabilities: the worker's own, moved as a stale sampler's would be, so that
    ratios differ from 1 and the band has something to clip."""
    old = no_padding_2_padding(log_probs, request).float()
    g = torch.Generator().manual_seed(1)
    mask = batch.batch["response_mask"]
    batch.batch["old_log_probs"] = (old + noise * torch.randn(old.shape, generator=g)) * mask


def update_request(batch: DataProto, cfg):
    """The request of ``update_actor``, as ``RayPPOTrainer._update_actor`` makes it."""
    batch.meta_info["multi_turn"] = False
    td = left_right_2_no_padding(batch.to_tensordict())
    actor = cfg.actor_rollout_ref.actor
    size = actor.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n
    tu.assign_non_tensor(td, calculate_entropy=False, distillation_use_topk=False,
                         distillation_only=False, global_batch_size=size, mini_batch_size=size,
                         epochs=actor.ppo_epochs, seed=actor.data_loader_seed,
                         dataloader_kwargs={"shuffle": actor.shuffle}, compute_loss=True)
    return td


# ----------------------------------------------------------------------------- the worker


def count_band_calls() -> dict:
    """Count the calls of the loss verl registered as ``band`` (fbands' band)."""
    calls = {"n": 0}
    band = core_algos.POLICY_LOSS_REGISTRY["band"]
    calls["loss"] = f"{band.__module__}.{band.__qualname__}"

    def counted(*args, **kwargs):
        calls["n"] += 1
        return band(*args, **kwargs)

    core_algos.POLICY_LOSS_REGISTRY["band"] = counted
    return calls


def weights(module) -> dict[str, torch.Tensor]:
    return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone().float()
            for k, v in module.state_dict().items()}


class Worker(ActorRolloutRefWorker):
    """verl's worker as it is, and one more method that reports what it did."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        self.band_calls = count_band_calls()
        return super().init_model()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def report(self):
        return {"calls": dict(self.band_calls), "weights": weights(self.actor.engine.module),
                "backend": torch.distributed.get_backend()}


def one_update(workers, cfg) -> tuple[dict, dict, dict]:
    """Old log-probabilities, then one update: (metrics, report before, report after)."""
    batch = rollout()
    request = log_prob_request(batch)
    stale(batch, request, tu.get(workers.compute_log_prob(request), "log_probs"))
    before = workers.report()
    out = workers.update_actor(update_request(batch, cfg))
    return tu.get(out, "metrics"), before, workers.report()


class _InProcess:
    """One worker in this process, answering as a worker group of one does (a list)."""

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        method = getattr(self.worker, name)
        if name == "report":
            return lambda: [method()]
        return method


def run_here(cfg):
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(name, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    worker = Worker(config=cfg.actor_rollout_ref, role="actor")
    worker.init_model()
    try:
        return one_update(_InProcess(worker), cfg)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def run_ray(cfg, world: int):
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    here = str(Path(__file__).resolve().parent)  # (the workers import this module by name)
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=max(2, world), num_gpus=0, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    try:
        import verl_cpu_update as this  # (so that Ray sends the class by reference)

        pool = RayResourcePool(process_on_nodes=[world], use_gpu=False, max_colocate_count=1)
        worker = RayClassWithInitArgs(cls=ray.remote(this.Worker),
                                      config=cfg.actor_rollout_ref, role="actor")
        group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, device_name="cpu")
        group.init_model()
        return one_update(group, cfg)
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ray", action="store_true", help="verl's Ray worker group")
    parser.add_argument("--world", type=int, default=1, help="ranks of the Ray worker group")
    parser.add_argument("--json", type=Path, help="also write what was found to this file")
    args, extra = parser.parse_known_args(argv)
    start = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="fbands-verl-cpu-"))
    try:
        cfg = compose(tiny_model(folder), extra)
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        print("band:", fv.loss_config(actor.policy_loss, actor))
        if args.ray:
            metrics, before, after = run_ray(cfg, args.world)
        else:
            metrics, before, after = run_here(cfg)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    moved = [float((after[0]["weights"][k] - before[0]["weights"][k]).abs().max())
             for k in before[0]["weights"]]
    calls = sum(r["calls"]["n"] for r in after)
    metrics = {k: float(v) for k, v in reduce_metrics(dict(metrics)).items()}
    found = {"ranks": len(after), "backend": after[0]["backend"], "band_calls": calls,
             "loss": after[0]["calls"]["loss"], "tensors": len(moved),
             "tensors_moved": sum(m > 0 for m in moved), "largest_move": max(moved),
             "metrics": metrics, "seconds": time.perf_counter() - start}
    shown = ("actor/pg_loss", "actor/pg_clipfrac", "actor/band/clipfrac_lower",
             "actor/band/clipfrac_upper", "actor/band/delta", "grad_norm")
    print(f"verl's update_actor on {found['ranks']} rank(s) ({found['backend']}): the band "
          f"ran {calls} time(s) ({found['loss']})")
    print("metrics:", {k: round(metrics[k], 4) for k in shown if k in metrics})
    print(f"weights moved: {found['tensors_moved']} of {found['tensors']} tensors, "
          f"largest change {found['largest_move']:.2e}; {found['seconds']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    if not (calls and found["tensors_moved"] and "actor/band/delta" in metrics):
        sys.exit("verl's update did not run the band")
    print("ok: verl's own actor update trained with the band on a CPU")
    return found


if __name__ == "__main__":
    main()
