"""Test suite of the fractional GPU DRA driver."""
