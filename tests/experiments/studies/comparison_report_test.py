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
