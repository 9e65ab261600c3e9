"""Light helpers shared by every iws node and tool: robot profiles, joint-command rules, image conversion, QoS presets. No torch, no MuJoCo."""
