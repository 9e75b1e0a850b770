"""An RL run: `loop.train_and_evaluate(config, workdir)`, around one `state.RunState` and the
programs `programs.build` makes for it. Its rooms:

  learn/    the learn program: rl_step (its phases), view, objective, forward, rl_types (Batch,
            LearnConfig), relora; examples (batches for benchmarks and tests)
  rollout/  the host side of rollouts: pipeline (queue, finish, decode, score), batch (the one
            Batch builder), budget (completion slots, per-prompt statistics), checks
  durable/  checkpointing (sealed, verified), workdir (one writer, config changes refused),
            recovery and collapse (rollback or stop)
  report/   evaluation, paired intervals, summary, metrics (jsonl, TensorBoard), figures
  setup/    validation (the one config check), builders, prepare (data, tokenizer, model), data,
            warm_start and sft, features (PCL's prompt features)

The learn program imports nothing from rollout, setup, durable or report (tests/train/layout_test).
"""
