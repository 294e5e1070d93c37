"""The run lifecycle around ``lra.train``'s compose -> instantiate -> fit -> test -> record: who owns a run dir,
what a re-run resumes from, how a run stops and what it leaves behind. Nothing here builds a model or reads data.

``job``               one job of ``lra.train`` end to end: lock, completed or refused, claim, train, record, last line

Starting a run
    ``config_groups``   every config-group choice on the command line exists (a typo is refused before any write)
    ``start_checks``    before Hydra writes: keys nothing reads (``unread_keys``), a sweep without ``-m``, ``-m`` with
                        ``hydra.run.dir``, a ``hydra.run.dir`` folder that no run of ``lra.train`` made
    ``config_checks``   the composed config's values checked before anything is built
    ``hydra_callbacks`` an unwritable output dir is named before Hydra's log fails; a sweep's unfinished jobs
    ``run_dir``         who may write into a run dir, and which checkpoint a re-run resumes from
    ``run_lock``        one process per run dir (``flock`` on ``owner.lock``)
    ``gpu_setup``       TF32 and quiet consoles for ``trainer=gpu`` / ``trainer=ddp``
    ``allocator``       keep freed memory in the process (glibc ``mallopt``): benchmarks, not training

During a run
    ``trainer``         the loggers and the Lightning trainer, with the callbacks and plugins every run gets
    ``callbacks``       Lightning callbacks: checkpoints that follow a moved run dir, last-step validation, NaN stop
    ``checkpoints``     atomic saves, weights-only reads (no checkpoint runs code), weights transferred across
                        variants (refused when they do not fit), checkpoint settings
    ``data_checks``     before step 1: labels / token ids against the model's sizes, the data a resume trains on
                        against its checkpoint's (``accept_changed_data``), the best checkpoint still there
    ``csv_logger``      ``metrics.csv`` that a resumed run continues
    ``progress``        one progress bar per stage; ``console`` what a run prints (``verbose=true`` for all)
    ``stage_clock``     wall time of a stage summed over the processes of a resumed run
    ``interrupts``      SIGTERM and Ctrl-C take one path: finish the step, save, exit 143/130
    ``sweep_console``   a line before each job of a multirun

Ending a run
    ``results``         ``results.json``, the one record reports and sweeps read; settings compared on resume;
                        the test accuracies and ``predictions.json``
    ``run_end``         how a run that does not complete ends: its record, ``error.log`` and one FAILED line
    ``wandb_logger``, ``wandb_summary``  W&B's one-line banner; one W&B run across resumes (``wandb_history``
                        reads the offline parts); the run summary mirrors ``results.json``; the W&B run closed at the
                        end of each job
"""
