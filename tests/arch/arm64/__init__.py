"""Tests of the arm64 backend."""
