"""Test support: throwaway databases, service processes, fakes with the real interfaces."""
