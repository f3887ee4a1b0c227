"""The on-policy stages (PPO, GRPO, RLOO, REINFORCE): their declarations (`algorithms`), then one file
per phase of an update: `collect` (prompts drawn, sampled, gathered) -> `scoring` (log-probabilities,
values, rewards) -> `advantages` (equation 3 and the declared estimators) -> `update` (the clipped
update); the stage the loop driver runs, single- or multi-process (`trainer`), and what a run is
measured on (`evaluation`)."""
