"""Reading and analysing one survey, the same for the command line, the Analyst service and the
report: a survey's data from a store, its design data and design answers."""
