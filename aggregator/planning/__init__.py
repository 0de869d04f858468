"""Study planning for people: power or n per mechanism (study) and for comparisons of groups
(groups)."""
