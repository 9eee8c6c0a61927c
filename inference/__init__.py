"""Inference runtime for the hybrid Kimi-Linear / Kimi-K3 family. Depends on no other dayzero package."""
