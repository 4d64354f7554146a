"""Prior-fitting the demo TabPFN v3 host: synthetic prior, training loop, evaluation, model card."""
