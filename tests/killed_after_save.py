"""Run ``python -m dsh ...`` so that it kills itself, as a crash or an out-of-memory kill would, right after one
trainer has saved one checkpoint: the kill lands at that point whatever the host's speed (a poller watching the folder
can miss a short run's last checkpoints on a loaded host)."""

import signal
import subprocess

# a callback appended to every trainer, so its on_save runs after dsh's own (the checkpoint's totals written); it kills
# the whole process group (the run's own workers too)
_WRAPPER = """
import os, runpy, signal, sys
from pathlib import Path
import transformers
step, name = int(sys.argv.pop(1)), sys.argv.pop(1)
class KillAfterSave(transformers.TrainerCallback):
    def on_save(self, args, state, control, **kw):
        if state.global_step == step and (not name or Path(args.output_dir).name == name):
            os.killpg(os.getpgid(0), signal.SIGKILL)
init = transformers.Trainer.__init__
def init_and_kill(self, *a, **k):
    init(self, *a, **k)
    self.add_callback(KillAfterSave())
transformers.Trainer.__init__ = init_and_kill
sys.argv[0] = "dsh"
runpy.run_module("dsh", run_name="__main__", alter_sys=True)
"""


def run_killed_after_save(cmd: list, step: int, env: dict, run_name: str = "") -> str:
    """Run ``cmd`` (``[python, "-m", "dsh", ...]``) until the trainer whose output folder is named ``run_name`` (any
    trainer where it is empty) has saved ``checkpoint-{step}``, and kill it there; its stdout and stderr. Fails where
    the run was not killed there (it ended first, or failed)."""
    assert cmd[1:3] == ["-m", "dsh"], cmd
    r = subprocess.run([cmd[0], "-c", _WRAPPER, str(step), run_name] + cmd[3:], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    assert r.returncode == -signal.SIGKILL, f"not killed at {run_name or 'a'} checkpoint-{step} (exit {r.returncode}): " \
                                            f"{r.stdout[-2000:]}"
    return r.stdout
