"""Actors and messaging: the actor base class, mailboxes, the actor system and its
lifecycle, channels, the wait graph, locks and priority lending (serving)."""
