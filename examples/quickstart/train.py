"""A training script as trainguard runs it: checkpoints into TRAINGUARD_CHECKPOINT_DIR, resumes from
TRAINGUARD_RESUME_FROM. Stdlib only (a toy loss stands in for a model); --flaky-at-step makes the
first attempt lose its data connection there, as a real job does now and then."""
import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--checkpoint-every", type=int, default=10)
parser.add_argument("--flaky-at-step", type=int, default=0)
args = parser.parse_args()

checkpoints = os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "checkpoints")
resume_from = os.environ.get("TRAINGUARD_RESUME_FROM", "")
state = {"step": 0, "loss": 2.0}
if resume_from:
    with open(resume_from) as f:
        state = json.load(f)
print(f"attempt {os.environ.get('TRAINGUARD_ATTEMPT')}: starting at step {state['step']}", flush=True)

while state["step"] < args.steps:
    state["step"] += 1
    state["loss"] *= 0.95
    print(f"step {state['step']} loss {state['loss']:.4f}", flush=True)
    time.sleep(0.05)
    if state["step"] % args.checkpoint_every == 0:
        os.makedirs(checkpoints, exist_ok=True)
        path = os.path.join(checkpoints, f"step-{state['step']:06d}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)  # atomic: a crash never leaves half a checkpoint
    if state["step"] == args.flaky_at_step and os.environ.get("TRAINGUARD_ATTEMPT") == "1":
        raise ConnectionResetError("[Errno 104] Connection reset by peer while reading shard 7 from s3://datasets/")
print("training done", flush=True)
