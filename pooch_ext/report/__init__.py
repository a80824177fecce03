"""What users read: the classification table (CSV) and the timeline plot."""
