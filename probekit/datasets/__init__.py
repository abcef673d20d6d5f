"""Event and item datasets: where to find them and how to read them."""
