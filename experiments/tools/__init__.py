"""Tools that keep the documentation in step with the code, each run from the repository root as
`python -m experiments.tools.NAME`.

  config_reference  writes docs/config_reference.md from configs/*.py (`--check`: exit 1 when
                    the page is out of date)
  notebooks         runs the Colab notebooks (colab/*.ipynb) top to bottom at full size and saves
                    them with their outputs
"""
