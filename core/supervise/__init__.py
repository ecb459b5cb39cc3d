"""The processes of a launch: start each role in its own group, wait until healthy, warm it up, watch and restart it,
stop them all without orphans."""
