"""The on-policy stages (PPO, GRPO, RLOO): their declarations (`algorithms`), the rollout batch and
sampling (`rollout`), scoring, advantages and the clipped update (`update`), the stage the loop
driver runs, single- or multi-process (`trainer`), and the held-out evaluation (`evaluation`)."""
