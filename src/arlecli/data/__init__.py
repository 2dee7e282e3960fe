"""Where a card's rows come from: sources (hub, files, package resources), procedural generators
and the transforms that shape a row into a Task."""
