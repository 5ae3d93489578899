"""Real-kernel lab: fetch Debian kernels, boot them under QEMU, capture dumps with oracles."""
