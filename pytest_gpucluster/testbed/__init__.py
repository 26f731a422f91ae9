"""Stand-ins for a cluster on one machine, for this project's tests and benchmarks: network
namespaces as nodes (`testbed.netns`). Nothing here is needed to run the plugin."""
