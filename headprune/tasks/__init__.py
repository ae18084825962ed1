"""LightningModules for the NLI and MT tasks; both carry head gates."""
