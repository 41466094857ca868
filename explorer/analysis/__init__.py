"""Read-only analyses of a deferred module: a fake forward pass (`dry_run`), a memory plan over
devices (`plan_devices`), the recorded initialization as an FX program (`to_fx`) and a checkpoint
checked against the module from its headers (`check_checkpoint`)."""
