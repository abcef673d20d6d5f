"""Answer scoring: the exact logit engine, its slow references, and the generation baseline."""
