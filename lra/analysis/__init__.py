"""Paper tables and probes over finished runs: ``report`` (the tables, ``python -m lra.analysis.report``; its
parts ``report_runs``, ``report_settings``, ``report_rows``, ``report_summary``, ``report_tables``, ``significance``),
``report_plot`` (figures), ``comparability`` and ``published.yaml`` (the papers' numbers and when a run is
comparable with them), ``listops_cue`` / ``pathfinder_cue`` (what a shortcut alone scores) and
``diagnostics/`` (the ListOps recipe probes). Uses the training runtime; the runtime never imports it."""
