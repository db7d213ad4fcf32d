"""The trainer's smallest useful run, shared by the tests that need a real run folder."""

#: a run of seconds: a small model, no warm start, no evaluation, the clip loss
TINY_RUN = dict(steps=2, prompts_per_step=2, group_size=2, ppo_epochs=1, minibatches=1,
                warm_start_steps=0, tiny_d_model=16, tiny_heads=2, tiny_layers=1,
                eval_every=0, loss="clip", mechanism_metrics=False, progress=False,
                checkpoint_every=1)


def quiet(_msg) -> None:
    """A ``log`` that drops the trainer's messages."""
