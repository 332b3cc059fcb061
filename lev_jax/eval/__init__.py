"""Evaluation: validation perplexity, scoring, zero-shot tasks, lm-eval."""
