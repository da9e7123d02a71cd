"""pipecat-rl: record, simulate, train and gate Pipecat voice agents."""
