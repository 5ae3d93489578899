"""RISC-V backend tests: kernel steps, synthetic scenarios, the real corpus."""
