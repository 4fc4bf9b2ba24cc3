"""What a script does behind prudent's back, noticed: a hyperparameter it never reads, a
checkpoint of its own it resumes from."""
