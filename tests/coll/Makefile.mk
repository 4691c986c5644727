check_PROGRAMS += 
