"""Training processes: the job a stage hands to a (possibly multi-process) launch, TRL arguments and
placement, checkpoint directories and resume, and the SFT trainer."""
