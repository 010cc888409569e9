"""Operator alerts: telling a person who is not looking at the console that something needs them
(an escalated hold, a hold about to expire, an agent gone silent), once per thing, and letting
them acknowledge it. Builds on messaging and teams; the console shows and acknowledges."""
