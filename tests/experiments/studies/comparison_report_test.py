"""experiments/studies/comparison_report.py: the markdown of a comparison's summary."""

from experiments.studies import comparison_report as cr
from experiments.studies import comparison_stats as cs


def test_markdown_reports_the_sweep_only_where_a_method_ran_several_rates(run_record):
  swept = cs.summarise({("uniform", 2e-5, 1): run_record([0.0, 0.5]),
                        ("uniform", 4e-5, 1): run_record([0.0, 0.4]),
                        ("sec", 4e-5, 1): run_record([0.0, 0.6])}, 10)
  text = cr.markdown(swept, "synthetic")
  assert ("Learning-rate sweep (final held-out accuracy, mean over seeds): "
          "uniform: 2e-05 -> 50.0%, 4e-05 -> 40.0%\n") in text
  single = cs.summarise({("uniform", 2e-5, 1): run_record([0.0, 0.5]),
                         ("sec", 4e-5, 1): run_record([0.0, 0.6])}, 10)
  text = cr.markdown(single, "synthetic")
  assert "Learning-rate sweep" not in text
  assert "One learning rate per method, no sweep: uniform 2e-05, sec 4e-05." in text


def test_a_setting_without_ood_bins_reports_no_ood_accuracy(run_record):
  runs = {("uniform", 2e-5, 1): run_record([0.1, 0.2], ood=None),
          ("sec", 2e-5, 1): run_record([0.1, 0.3], ood=None)}
  s = cs.summarise(runs, 10)
  assert s["methods"]["sec"]["final_ood"] is None
  row = next(line for line in cr.markdown(s, "synthetic").splitlines()
             if line.startswith("| sec |"))
  assert row.split(" | ")[7] == "-"  # the OOD column, after the area under the curve


def _tested(run_record, test_seed_2=True) -> dict:
  """A summary of uniform and SEC (two seeds each) at 2e-5, with test outcomes on bins a, b and
  the OOD bin o; without uniform's seed 2's unless `test_seed_2`. Test accuracy: uniform 0.375
  and 0.625, SEC 0.75 and 0.75."""
  test = {("uniform", 1): {"a": [1, 1, 0, 0], "b": [1, 0, 0, 0]},
          ("uniform", 2): {"a": [1, 1, 1, 0], "b": [1, 1, 0, 0]},
          ("sec", 1): {"a": [1, 1, 1, 1], "b": [1, 1, 0, 0]},
          ("sec", 2): {"a": [1, 1, 1, 0], "b": [1, 1, 1, 0]}}
  runs = {(m, 2e-5, s): run_record([0.0, 0.5 if m == "uniform" else 0.6], test=t,
                                   test_ood={"o": [1, 0]})
          for (m, s), t in test.items() if test_seed_2 or (m, s) != ("uniform", 2)}
  if not test_seed_2:
    runs[("uniform", 2e-5, 2)] = run_record([0.0, 0.5])
  return cs.summarise(runs, 10, order=("uniform", "sec"))


def test_markdown_adds_the_test_split_once_every_chosen_run_has_it(run_record):
  s = _tested(run_record)
  assert s["split"] == "test"
  text = cr.markdown(s, "synthetic")
  assert "## Validation split (learning rates chosen on it)" in text
  assert "## Test split (never used for a choice)" in text
  assert "| sec | 2e-05 | 2 | 75.0 [75.0, 75.0] | 50.0 [50.0, 50.0] |" in text
  assert "| uniform | 2e-05 | 2 | 50.0 [" in text
  assert "| method | a | b | o |" in text   # per-bin test accuracy, the OOD bin included
  row = next(line for line in text.splitlines() if line.startswith("| uniform - sec | -25.0"))
  cells = row.split(" | ")
  d, boot = s["pairs"][0]["final_test"], s["pairs"][0]["final_test_bootstrap"]
  assert cells[1] == f"-25.0 [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"
  assert cells[2] == f"-25.0 [{100 * boot['lo']:+.1f}, {100 * boot['hi']:+.1f}]"
  assert cells[3] == ("b higher" if d["hi"] < 0 else "no")
  assert cells[4] == "+0.0 [+0.0, +0.0] |"   # both sides 1 of 2 right on the OOD bin
  assert "## Matched learning rates" in text
  assert "| 2e-05 | uniform - sec | 2 | - | -25.0 [" in text  # no validation outcomes kept


def test_markdown_without_test_outcomes_stays_on_validation(run_record):
  s = _tested(run_record, test_seed_2=False)
  assert s["split"] == "validation"
  text = cr.markdown(s, "synthetic")
  assert "## Validation split (learning rates chosen on it)" in text
  assert "no test numbers" in text
  assert "Test split" not in text and "final test" not in text
  assert "| 2e-05 | uniform - sec | 2 | - | - |" in text
  # A summary from before splits were named reads as it did.
  old = {k: v for k, v in s.items() if k not in ("split", "matched_pairs")}
  text = cr.markdown(old, "synthetic")
  assert text.startswith("# Curricula compared: synthetic\n\nBudget 10 rollouts per run.")
  assert "Validation split" not in text and "Matched learning rates" not in text
