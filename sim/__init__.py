"""The simulated world: virtual clock, seeded choices, fake provider and tools, fault harness."""
