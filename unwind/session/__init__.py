"""A dump opened for replay: the Session, batch replay and printing replays."""
