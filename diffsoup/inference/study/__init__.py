"""The study model: experiments (conditions, times, data, noise), their arrays with a leading
experiment axis, the parameter table, pre-equilibration and the multiple-shooting trajectory spec."""
